//! Command-line arguments shared by several commands.

use std::collections::HashMap;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::{CapacityRange, VolumeCapability};

/// Access modes by their spec names in kebab case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccessMode {
    /// SINGLE_NODE_WRITER
    SingleNodeWriter,
    /// SINGLE_NODE_READER_ONLY
    SingleNodeReaderOnly,
    /// MULTI_NODE_READER_ONLY
    MultiNodeReaderOnly,
    /// MULTI_NODE_SINGLE_WRITER
    MultiNodeSingleWriter,
    /// MULTI_NODE_MULTI_WRITER
    MultiNodeMultiWriter,
    /// SINGLE_NODE_SINGLE_WRITER
    SingleNodeSingleWriter,
    /// SINGLE_NODE_MULTI_WRITER
    SingleNodeMultiWriter,
}

impl From<AccessMode> for Mode {
    fn from(m: AccessMode) -> Self {
        match m {
            AccessMode::SingleNodeWriter => Mode::SingleNodeWriter,
            AccessMode::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
            AccessMode::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
            AccessMode::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
            AccessMode::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
            AccessMode::SingleNodeSingleWriter => Mode::SingleNodeSingleWriter,
            AccessMode::SingleNodeMultiWriter => Mode::SingleNodeMultiWriter,
        }
    }
}

/// The contexts a node call carries from earlier calls.
#[derive(Debug, Clone, Args)]
pub struct ContextArgs {
    /// Publish context from ControllerPublishVolume (repeatable).
    #[arg(long = "publish-context", value_parser = parse_kv)]
    pub publish_context: Vec<(String, String)>,
    /// Volume context from CreateVolume (repeatable).
    #[arg(long = "volume-context", value_parser = parse_kv)]
    pub volume_context: Vec<(String, String)>,
}

/// Where a node call finds a volume.
#[derive(Debug, Clone, Args)]
pub struct VolumePathArgs {
    /// A path where the volume is published or staged.
    #[arg(long)]
    pub volume_path: String,
    /// Where it is staged.
    #[arg(long, default_value = "")]
    pub staging_path: String,
}

/// The volume capability of a request.
#[derive(Debug, Clone, Args)]
pub struct CapabilityArgs {
    /// Raw block access instead of a filesystem.
    #[arg(long)]
    pub block: bool,
    /// Filesystem type for mount access (empty: the driver's default).
    #[arg(long, default_value = "")]
    pub fs_type: String,
    /// A mount flag (repeatable). Never printed.
    #[arg(long = "mount-flag", value_name = "FLAG")]
    pub mount_flags: Vec<String>,
    /// Access mode.
    #[arg(long, value_enum, default_value_t = AccessMode::SingleNodeWriter)]
    pub access_mode: AccessMode,
}

impl CapabilityArgs {
    /// The capability these arguments describe.
    pub fn capability(&self) -> VolumeCapability {
        let cap = if self.block {
            VolumeCapability::block()
        } else {
            VolumeCapability::mount(self.fs_type.clone()).with_mount_flags(self.mount_flags.clone())
        };
        cap.with_access_mode(self.access_mode.into())
    }
}

/// A size range such as `--size 1Gi --limit 2Gi`.
#[derive(Debug, Clone, Args)]
pub struct SizeArgs {
    /// Required size (e.g. 1Gi, 500Mi, 1073741824).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<i64>,
    /// Upper limit of the size.
    #[arg(long, value_parser = parse_size)]
    pub limit: Option<i64>,
}

impl SizeArgs {
    /// The capacity range, if any bound was given.
    pub fn range(&self) -> Option<CapacityRange> {
        (self.size.is_some() || self.limit.is_some())
            .then(|| CapacityRange::between(self.size.unwrap_or(0), self.limit.unwrap_or(0)))
    }
}

/// Parses `1Gi`-style sizes.
pub fn parse_size(text: &str) -> Result<i64, String> {
    csi_proto::size::parse_bytes(text)
        .ok_or_else(|| format!("{text:?} is not a size like 1Gi or 1073741824"))
}

/// Parses `key=value`.
pub fn parse_kv(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{text:?} is not key=value"))
}

/// Collects repeated `key=value` arguments into a map.
pub fn to_map(pairs: &[(String, String)]) -> HashMap<String, String> {
    pairs.iter().cloned().collect()
}

/// Where secrets come from. They are sent with every request that has a
/// secrets field and never printed.
#[derive(Debug, Clone, Args)]
pub struct SecretArgs {
    /// A file holding secrets: a JSON object of strings, or `key=value` lines.
    #[arg(long, env = "CSIKIT_SECRETS_FILE", global = true)]
    pub secrets_file: Option<PathBuf>,
    /// The name of an environment variable holding secrets (same formats as
    /// the file), for callers that cannot write a file.
    #[arg(
        long,
        global = true,
        value_name = "VAR",
        conflicts_with = "secrets_file"
    )]
    pub secrets_env: Option<String>,
}

/// Why secrets could not be read. The file's contents are never shown.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The file could not be read.
    #[error("cannot read secrets file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The named environment variable is not set.
    #[error("environment variable {0} (from --secrets-env) is not set")]
    MissingEnv(String),
    /// The variable is neither a JSON object of strings nor `key=value` lines.
    #[error(
        "environment variable {var}: line {line} is not key=value (and it is not a JSON object of strings)"
    )]
    EnvSyntax {
        /// The variable.
        var: String,
        /// The first bad line.
        line: usize,
    },
    /// The file is neither a JSON object of strings nor `key=value` lines.
    #[error(
        "secrets file {path}: line {line} is not key=value (and the file is not a JSON object of strings)"
    )]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The first bad line.
        line: usize,
    },
}

impl SecretArgs {
    /// Loads the secrets (empty when no file is given).
    pub fn load(&self) -> Result<HashMap<String, String>, SecretsError> {
        if let Some(var) = &self.secrets_env {
            let text = std::env::var(var).map_err(|_| SecretsError::MissingEnv(var.clone()))?;
            return parse_secrets(&text).map_err(|line| SecretsError::EnvSyntax {
                var: var.clone(),
                line,
            });
        }
        let Some(path) = &self.secrets_file else {
            return Ok(HashMap::new());
        };
        let text = std::fs::read_to_string(path).map_err(|source| SecretsError::Read {
            path: path.clone(),
            source,
        })?;
        parse_secrets(&text).map_err(|line| SecretsError::Syntax {
            path: path.clone(),
            line,
        })
    }
}

/// Parses secrets text; the error is the first bad line number.
pub fn parse_secrets(text: &str) -> Result<HashMap<String, String>, usize> {
    if let Ok(map) = serde_json::from_str::<HashMap<String, String>>(text) {
        return Ok(map);
    }
    let mut map = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or(i + 1)?;
        map.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_parse_from_json_or_lines_without_echoing() {
        assert_eq!(parse_secrets(r#"{"a":"1"}"#).unwrap()["a"], "1");
        let m = parse_secrets("# comment\nuser = admin\npass=x=y\n").unwrap();
        assert_eq!((m["user"].as_str(), m["pass"].as_str()), ("admin", "x=y"));
        assert_eq!(parse_secrets("ok=1\nhunter2\n"), Err(2));
    }

    #[test]
    fn secrets_from_an_environment_variable() {
        // SAFETY: this test is the only user of this variable name.
        unsafe { std::env::set_var("CSI_KIT_TEST_SECRETS_7f", "token=abc") };
        let args = SecretArgs {
            secrets_file: None,
            secrets_env: Some("CSI_KIT_TEST_SECRETS_7f".into()),
        };
        assert_eq!(args.load().unwrap()["token"], "abc");
        let missing = SecretArgs {
            secrets_file: None,
            secrets_env: Some("CSI_KIT_TEST_UNSET_7f".into()),
        };
        let err = missing.load().unwrap_err().to_string();
        assert!(
            err.contains("CSI_KIT_TEST_UNSET_7f") && err.contains("not set"),
            "{err}"
        );
    }

    #[test]
    fn capability_and_sizes() {
        let args = CapabilityArgs {
            block: false,
            fs_type: "xfs".into(),
            mount_flags: vec!["noatime".into()],
            access_mode: AccessMode::MultiNodeMultiWriter,
        };
        let cap = args.capability();
        assert_eq!(cap.mount_volume().unwrap().fs_type, "xfs");
        assert_eq!(cap.access_mode(), Mode::MultiNodeMultiWriter);
        assert_eq!(parse_size("2Gi"), Ok(2 << 30));
        assert!(parse_size("2 apples").is_err());
        assert_eq!(
            SizeArgs {
                size: Some(5),
                limit: None
            }
            .range(),
            Some(CapacityRange::at_least(5))
        );
        assert_eq!(
            SizeArgs {
                size: None,
                limit: None
            }
            .range(),
            None
        );
        assert_eq!(parse_kv("a=b=c"), Ok(("a".into(), "b=c".into())));
    }
}
