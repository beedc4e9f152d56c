//! Mutable parameters (VolumeAttributesClass) a driver accepts.
//!
//! The spec: ControllerModifyVolume with a key or value the plugin cannot
//! apply is INVALID_ARGUMENT and means nothing was applied; CreateVolume's
//! `mutable_parameters` follow the same rules. Checking every key before
//! any change is what makes "nothing applied" true. The server runs
//! [`check_accepted`] itself for drivers that declare their keys with
//! [`Capabilities::mutable_parameters`](crate::Capabilities::mutable_parameters);
//! [`parse`] reads one value, naming the key when it does not parse.
//!
//! ```
//! use std::collections::{BTreeSet, HashMap};
//! use csi_driver::helpers::mutable::{check_accepted, parse};
//!
//! let accepted: BTreeSet<String> = ["iops".to_string()].into();
//! let mut params = HashMap::from([("iops".to_string(), "3000".to_string())]);
//! check_accepted("mutable_parameters", &params, &accepted).unwrap();
//! assert_eq!(parse::<u32>("mutable_parameters", &params, "iops").unwrap(), Some(3000));
//!
//! params.insert("XXX_FakeKey".into(), "x".into());
//! let err = check_accepted("mutable_parameters", &params, &accepted).unwrap_err();
//! assert!(err.to_string().starts_with("mutable_parameters[\"XXX_FakeKey\"]"));
//! ```

use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;

use crate::error::CsiError;

/// INVALID_ARGUMENT naming the first key (in sorted order, so the answer is
/// stable) that is not in `accepted`. Values are never echoed.
pub fn check_accepted(
    field: &str,
    params: &HashMap<String, String>,
    accepted: &BTreeSet<String>,
) -> Result<(), CsiError> {
    let Some(key) = params.keys().filter(|k| !accepted.contains(*k)).min() else {
        return Ok(());
    };
    let known = if accepted.is_empty() {
        "none".to_string()
    } else {
        accepted.iter().cloned().collect::<Vec<_>>().join(", ")
    };
    Err(CsiError::invalid(
        format!("{field}[{key:?}]"),
        format!("not a mutable parameter this plugin accepts (accepted: {known})"),
    ))
}

/// The value of `key` parsed as `T`, `None` when absent; INVALID_ARGUMENT
/// naming the key (not the value) when it does not parse.
pub fn parse<T: FromStr>(
    field: &str,
    params: &HashMap<String, String>,
    key: &str,
) -> Result<Option<T>, CsiError> {
    params
        .get(key)
        .map(|v| {
            v.parse().map_err(|_| {
                CsiError::invalid(
                    format!("{field}[{key:?}]"),
                    format!("not a valid {}", std::any::type_name::<T>()),
                )
            })
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn empty_parameters_are_always_accepted() {
        assert!(check_accepted("m", &HashMap::new(), &BTreeSet::new()).is_ok());
    }

    #[test]
    fn the_first_unaccepted_key_is_named_and_no_value_is_echoed() {
        let accepted: BTreeSet<String> = ["iops".to_string(), "tier".to_string()].into();
        let params = map(&[("zeta", "secret-ish"), ("iops", "1"), ("alpha", "v")]);
        let err = check_accepted("mutable_parameters", &params, &accepted).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let msg = err.to_string();
        assert!(msg.starts_with("mutable_parameters[\"alpha\"]: "), "{msg}");
        assert!(msg.contains("iops, tier"), "{msg}");
        assert!(!msg.contains("secret-ish"), "{msg}");
        let none = check_accepted("m", &params, &BTreeSet::new()).unwrap_err();
        assert!(none.to_string().contains("accepted: none"), "{none}");
        assert!(check_accepted("m", &map(&[("tier", "gold")]), &accepted).is_ok());
    }

    #[test]
    fn values_parse_or_name_their_key() {
        let params = map(&[("iops", "many")]);
        assert_eq!(parse::<u32>("m", &params, "absent").unwrap(), None);
        let err = parse::<u32>("m", &params, "iops").unwrap_err();
        assert_eq!(err.to_string(), "m[\"iops\"]: not a valid u32");
    }
}
