//! Results of a run: per-check outcomes, a plain-text summary and JUnit XML.

use std::fmt;
use std::path::Path;
use std::time::Duration;

/// The part of the specification a check exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Group {
    /// Identity service.
    Identity,
    /// Controller service (volumes, publishing, expansion, modification).
    Controller,
    /// Controller snapshot RPCs.
    Snapshot,
    /// Node service.
    Node,
    /// GroupController service.
    GroupController,
    /// Rules spanning every service, such as secrets never reaching logs.
    General,
}

impl Group {
    /// The group's name as used in skip patterns and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Identity => "identity",
            Self::Controller => "controller",
            Self::Snapshot => "snapshot",
            Self::Node => "node",
            Self::GroupController => "group-controller",
            Self::General => "general",
        }
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a check failed, with enough context to act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The RPC whose answer broke a rule, e.g. `CreateVolume`.
    pub rpc: Option<String>,
    /// The request as sent, secrets redacted (`Debug`).
    pub request: Option<String>,
    /// The expected gRPC code or outcome, e.g. `NOT_FOUND`.
    pub expected: Option<String>,
    /// The actual gRPC code and message, e.g. `INTERNAL: boom`.
    pub actual: Option<String>,
    /// What went wrong, in words.
    pub message: String,
}

impl Failure {
    /// A failure described only in words.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            rpc: None,
            request: None,
            expected: None,
            actual: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rpc {
            Some(rpc) => write!(f, "{rpc}: {}", self.message)?,
            None => f.write_str(&self.message)?,
        }
        if let Some(e) = &self.expected {
            write!(f, "\n  expected: {e}")?;
        }
        if let Some(a) = &self.actual {
            write!(f, "\n  actual:   {a}")?;
        }
        if let Some(r) = &self.request {
            write!(f, "\n  request:  {r}")?;
        }
        Ok(())
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Every assertion held.
    Passed,
    /// A rule was broken.
    Failed(Failure),
    /// Not run, with the reason (capability not advertised, skipped by config, ...).
    Skipped(String),
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// Stable check id, e.g. `controller.create_volume.idempotent`.
    pub id: String,
    /// The group the check belongs to.
    pub group: Group,
    /// What the check verifies.
    pub description: String,
    /// The outcome.
    pub status: Status,
    /// Wall time including cleanup.
    pub duration: Duration,
}

/// The results of a whole run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// `name vendor_version` from GetPluginInfo, when it answered.
    pub plugin: Option<String>,
    /// Every check in run order, skipped ones included.
    pub results: Vec<CheckResult>,
    /// Wall time of the run.
    pub duration: Duration,
}

impl Report {
    /// Checks that passed.
    pub fn passed(&self) -> usize {
        self.count(|s| matches!(s, Status::Passed))
    }

    /// Checks that failed.
    pub fn failed(&self) -> usize {
        self.count(|s| matches!(s, Status::Failed(_)))
    }

    /// Checks that were skipped.
    pub fn skipped(&self) -> usize {
        self.count(|s| matches!(s, Status::Skipped(_)))
    }

    /// The ids of the checks that were skipped, in run order.
    pub fn skipped_ids(&self) -> Vec<&str> {
        self.results
            .iter()
            .filter(|r| matches!(r.status, Status::Skipped(_)))
            .map(|r| r.id.as_str())
            .collect()
    }

    /// True when no check failed.
    pub fn is_success(&self) -> bool {
        self.failed() == 0
    }

    /// The failed checks with their failures.
    pub fn failures(&self) -> impl Iterator<Item = (&CheckResult, &Failure)> {
        self.results.iter().filter_map(|r| match &r.status {
            Status::Failed(f) => Some((r, f)),
            _ => None,
        })
    }

    /// The result of the check `id`, if it is in the report.
    pub fn get(&self, id: &str) -> Option<&CheckResult> {
        self.results.iter().find(|r| r.id == id)
    }

    fn count(&self, pred: impl Fn(&Status) -> bool) -> usize {
        self.results.iter().filter(|r| pred(&r.status)).count()
    }

    /// Renders the report as JUnit XML: one `<testsuite>` per group.
    pub fn to_junit_xml(&self) -> String {
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        out.push_str(&format!(
            "<testsuites name=\"csi-conformance\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{:.3}\">\n",
            self.results.len(),
            self.failed(),
            self.skipped(),
            self.duration.as_secs_f64()
        ));
        let mut groups: Vec<Group> = self.results.iter().map(|r| r.group).collect();
        groups.sort();
        groups.dedup();
        for group in groups {
            let in_group: Vec<&CheckResult> =
                self.results.iter().filter(|r| r.group == group).collect();
            let time: Duration = in_group.iter().map(|r| r.duration).sum();
            let failures = in_group
                .iter()
                .filter(|r| matches!(r.status, Status::Failed(_)))
                .count();
            let skipped = in_group
                .iter()
                .filter(|r| matches!(r.status, Status::Skipped(_)))
                .count();
            out.push_str(&format!(
                "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{:.3}\">\n",
                xml_escape(group.as_str()),
                in_group.len(),
                time.as_secs_f64()
            ));
            for r in in_group {
                out.push_str(&format!(
                    "    <testcase classname=\"csi-conformance.{}\" name=\"{}\" time=\"{:.3}\"",
                    xml_escape(group.as_str()),
                    xml_escape(&r.id),
                    r.duration.as_secs_f64()
                ));
                match &r.status {
                    Status::Passed => out.push_str("/>\n"),
                    Status::Skipped(reason) => out.push_str(&format!(
                        ">\n      <skipped message=\"{}\"/>\n    </testcase>\n",
                        xml_escape(reason)
                    )),
                    Status::Failed(f) => out.push_str(&format!(
                        ">\n      <failure message=\"{}\" type=\"{}\">{}</failure>\n    </testcase>\n",
                        xml_escape(&f.message),
                        xml_escape(f.expected.as_deref().unwrap_or("failure")),
                        xml_escape(&f.to_string())
                    )),
                }
            }
            out.push_str("  </testsuite>\n");
        }
        out.push_str("</testsuites>\n");
        out
    }

    /// Writes [`to_junit_xml`](Self::to_junit_xml) to `path`.
    pub fn write_junit(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_junit_xml())
    }
}

/// Escapes text for XML attributes and content, dropping characters XML 1.0
/// cannot carry at all (most C0 controls).
pub(crate) fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\t' | '\r' => out.push_str(&format!("&#{};", c as u32)),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "CSI conformance report for {}",
            self.plugin.as_deref().unwrap_or("<unknown plugin>")
        )?;
        for r in &self.results {
            let ms = r.duration.as_millis();
            match &r.status {
                Status::Passed => writeln!(f, "  PASS  {} ({ms} ms)", r.id)?,
                Status::Skipped(reason) => writeln!(f, "  SKIP  {}: {reason}", r.id)?,
                Status::Failed(_) => writeln!(f, "  FAIL  {} ({ms} ms)", r.id)?,
            }
        }
        let failures: Vec<_> = self.failures().collect();
        if !failures.is_empty() {
            writeln!(f, "\nFailures:")?;
            for (r, failure) in failures {
                writeln!(f, "\n[{}] {}", r.id, r.description)?;
                for line in failure.to_string().lines() {
                    writeln!(f, "  {line}")?;
                }
            }
        }
        writeln!(
            f,
            "\n{} passed, {} failed, {} skipped ({} checks, {:.2} s)",
            self.passed(),
            self.failed(),
            self.skipped(),
            self.results.len(),
            self.duration.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        let failure = Failure {
            rpc: Some("CreateVolume".into()),
            request: Some("CreateVolumeRequest { name: \"a<b\" }".into()),
            expected: Some("INVALID_ARGUMENT".into()),
            actual: Some("OK".into()),
            message: "name & caps".into(),
        };
        let result = |id: &str, group, status| CheckResult {
            id: id.into(),
            group,
            description: "d".into(),
            status,
            duration: Duration::from_millis(3),
        };
        Report {
            plugin: Some("x 1".into()),
            results: vec![
                result("identity.probe", Group::Identity, Status::Passed),
                result("controller.a", Group::Controller, Status::Failed(failure)),
                result("node.b", Group::Node, Status::Skipped("no \"cap\"".into())),
            ],
            duration: Duration::from_millis(9),
        }
    }

    #[test]
    fn display_names_rpc_codes_and_request() {
        let text = sample().to_string();
        assert!(text.contains("PASS  identity.probe"));
        assert!(text.contains("SKIP  node.b: no \"cap\""));
        assert!(text.contains("CreateVolume: name & caps"));
        assert!(text.contains("expected: INVALID_ARGUMENT"));
        assert!(text.contains("actual:   OK"));
        assert!(text.contains("1 passed, 1 failed, 1 skipped (3 checks"));
    }

    #[test]
    fn junit_escapes_everything() {
        let xml = sample().to_junit_xml();
        assert!(xml.contains("message=\"name &amp; caps\""));
        assert!(xml.contains("a&lt;b"));
        assert!(xml.contains("<skipped message=\"no &quot;cap&quot;\"/>"));
        assert!(xml.contains("tests=\"3\" failures=\"1\" skipped=\"1\""));
        assert_eq!(xml_escape("a\u{1}b'\n"), "a\u{FFFD}b&apos;&#10;");
    }
}
