//! Byte sizes: unit constants, rounding and human-readable formatting.
//!
//! CSI carries sizes as `i64` bytes; these helpers keep the arithmetic in one
//! place and saturate instead of overflowing.

/// 1 KiB in bytes.
pub const KIB: i64 = 1 << 10;
/// 1 MiB in bytes.
pub const MIB: i64 = 1 << 20;
/// 1 GiB in bytes.
pub const GIB: i64 = 1 << 30;
/// 1 TiB in bytes.
pub const TIB: i64 = 1 << 40;

/// Rounds `bytes` up to a multiple of `unit` (saturating at the largest
/// multiple that fits in `i64`). Non-positive sizes round to 0.
///
/// ```
/// use csi_proto::size::{round_up, MIB};
/// assert_eq!(round_up(1, MIB), MIB);
/// assert_eq!(round_up(MIB, MIB), MIB);
/// assert_eq!(round_up(0, MIB), 0);
/// ```
pub fn round_up(bytes: i64, unit: i64) -> i64 {
    assert!(unit > 0, "unit must be positive");
    if bytes <= 0 {
        return 0;
    }
    let rem = bytes % unit;
    if rem == 0 {
        bytes
    } else {
        bytes
            .checked_add(unit - rem)
            .unwrap_or(i64::MAX - i64::MAX % unit)
    }
}

/// Rounds `bytes` down to a multiple of `unit`; negative sizes give 0.
pub fn round_down(bytes: i64, unit: i64) -> i64 {
    assert!(unit > 0, "unit must be positive");
    if bytes <= 0 { 0 } else { bytes - bytes % unit }
}

/// Formats a size with binary units, e.g. `1.5 GiB`, for messages and logs.
///
/// ```
/// assert_eq!(csi_proto::size::format_bytes(3 * csi_proto::size::MIB / 2), "1.5 MiB");
/// assert_eq!(csi_proto::size::format_bytes(512), "512 B");
/// ```
pub fn format_bytes(bytes: i64) -> String {
    const UNITS: [(&str, i64); 4] = [("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)];
    for (name, unit) in UNITS {
        if bytes.unsigned_abs() >= unit as u64 {
            let value = bytes as f64 / unit as f64;
            let text = format!("{value:.1}");
            let text = text.strip_suffix(".0").unwrap_or(&text);
            return format!("{text} {name}");
        }
    }
    format!("{bytes} B")
}

/// Parses sizes such as `"10Gi"`, `"512Mi"`, `"1G"`, `"4096"` (Kubernetes
/// quantity suffixes, binary and decimal) into bytes.
///
/// ```
/// use csi_proto::size::{parse_bytes, GIB};
/// assert_eq!(parse_bytes("10Gi"), Some(10 * GIB));
/// assert_eq!(parse_bytes("1k"), Some(1000));
/// assert_eq!(parse_bytes("-1"), None);
/// ```
pub fn parse_bytes(text: &str) -> Option<i64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: i64 = digits.parse().ok()?;
    let multiplier: i64 = match suffix {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => KIB,
        "Mi" => MIB,
        "Gi" => GIB,
        "Ti" => TIB,
        _ => return None,
    };
    number.checked_mul(multiplier)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_saturates_instead_of_overflowing() {
        assert_eq!(round_up(i64::MAX, GIB), i64::MAX - i64::MAX % GIB);
        assert_eq!(round_up(-5, MIB), 0);
        assert_eq!(round_down(3 * MIB + 1, MIB), 3 * MIB);
        assert_eq!(round_down(-1, MIB), 0);
    }

    #[test]
    fn formats_and_parses() {
        assert_eq!(format_bytes(GIB), "1 GiB");
        assert_eq!(format_bytes(5 * TIB), "5 TiB");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(parse_bytes("2Ti"), Some(2 * TIB));
        assert_eq!(parse_bytes("12"), Some(12));
        assert_eq!(parse_bytes("1Gx"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999Ti"), None);
    }
}
