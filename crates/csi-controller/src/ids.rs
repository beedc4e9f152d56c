//! Ids the service generates, and the check that an id is one of them
//! before it becomes a path.

/// Kinds of generated ids, each with its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// `vol-<32 hex>`.
    Volume,
    /// `snap-<32 hex>`.
    Snapshot,
    /// `group-<32 hex>`.
    GroupSnapshot,
}

impl IdKind {
    fn prefix(self) -> &'static str {
        match self {
            IdKind::Volume => "vol-",
            IdKind::Snapshot => "snap-",
            IdKind::GroupSnapshot => "group-",
        }
    }

    /// A fresh id.
    pub fn generate(self) -> String {
        format!("{}{}", self.prefix(), uuid::Uuid::new_v4().simple())
    }

    /// Whether `id` is one the engine could have generated. Ids become
    /// paths, so anything else (`../../etc`, `a/b`, NUL) is rejected before
    /// it touches the filesystem.
    pub fn is_valid(self, id: &str) -> bool {
        id.strip_prefix(self.prefix()).is_some_and(|hex| {
            hex.len() == 32
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_validated_before_use_as_paths() {
        let id = IdKind::Volume.generate();
        assert!(IdKind::Volume.is_valid(&id));
        assert!(!IdKind::Snapshot.is_valid(&id));
        for bad in [
            "../../etc",
            "vol-../../etc",
            "vol-",
            "vol-a/b",
            "vol-\0",
            &format!("{id}x"),
            &id.to_uppercase(),
        ] {
            assert!(!IdKind::Volume.is_valid(bad), "{bad:?}");
        }
    }
}
