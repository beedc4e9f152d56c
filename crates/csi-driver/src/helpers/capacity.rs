//! Resolving a CreateVolume/Expand `capacity_range` to one size.

use csi_proto::size::{format_bytes, round_down, round_up};
use csi_proto::v1::CapacityRange;

use crate::error::CsiError;

/// What the backend can provision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityPolicy {
    /// The size when the range gives no lower bound.
    pub default_size: i64,
    /// The smallest volume (0: no minimum).
    pub min_size: i64,
    /// The largest volume (0: no maximum).
    pub max_size: i64,
    /// Sizes are multiples of this (1: any size).
    pub unit: i64,
}

impl CapacityPolicy {
    /// Any size in multiples of `unit`, `default_size` when unspecified.
    pub fn new(default_size: i64, unit: i64) -> Self {
        Self {
            default_size,
            min_size: 0,
            max_size: 0,
            unit: unit.max(1),
        }
    }
}

/// Picks the size to provision: the required size (or the default, or the
/// minimum) rounded up to the unit, which must not exceed `limit_bytes` or
/// the maximum. When the range cannot be met: OUT_OF_RANGE.
pub fn resolve_capacity(
    range: Option<&CapacityRange>,
    policy: &CapacityPolicy,
) -> Result<i64, CsiError> {
    let unit = policy.unit.max(1);
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(CsiError::invalid("capacity_range", "must not be negative"));
    }
    if limit > 0 && limit < required {
        return Err(CsiError::invalid(
            "capacity_range.limit_bytes",
            "must not be smaller than required_bytes",
        ));
    }
    let mut want = if required > 0 {
        required
    } else if limit > 0 {
        policy.default_size.min(limit)
    } else {
        policy.default_size
    };
    want = want.max(policy.min_size);
    let size = round_up(want, unit);
    let ceiling = match (limit, policy.max_size) {
        (0, 0) => i64::MAX,
        (0, m) | (m, 0) => m,
        (l, m) => l.min(m),
    };
    if size > ceiling || round_down(ceiling, unit) < size {
        return Err(CsiError::OutOfRange(format!(
            "cannot provision between {} and {} in units of {}",
            format_bytes(required),
            if ceiling == i64::MAX {
                "unlimited".into()
            } else {
                format_bytes(ceiling)
            },
            format_bytes(unit)
        )));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::size::{GIB, MIB};
    use tonic::Code;

    #[test]
    fn table() {
        let p = CapacityPolicy {
            default_size: GIB,
            min_size: 64 * MIB,
            max_size: 100 * GIB,
            unit: MIB,
        };
        let r = |req, lim| Some(CapacityRange::between(req, lim));
        let cases: Vec<(Option<CapacityRange>, Result<i64, Code>)> = vec![
            (None, Ok(GIB)),
            (r(0, 0), Ok(GIB)),
            (r(1, 0), Ok(64 * MIB)),
            (r(GIB + 1, 0), Ok(GIB + MIB)),
            (r(0, 512 * MIB), Ok(512 * MIB)),
            (r(0, 32 * MIB), Err(Code::OutOfRange)),
            (r(GIB + 1, GIB + 2), Err(Code::OutOfRange)),
            (r(200 * GIB, 0), Err(Code::OutOfRange)),
            (r(5 * GIB, 5 * GIB), Ok(5 * GIB)),
            (r(2, 1), Err(Code::InvalidArgument)),
            (r(-1, 0), Err(Code::InvalidArgument)),
        ];
        for (range, want) in cases {
            let got = resolve_capacity(range.as_ref(), &p).map_err(|e| e.code());
            assert_eq!(got, want, "{range:?}");
        }
        assert_eq!(resolve_capacity(None, &CapacityPolicy::new(10, 1)), Ok(10));
    }
}
