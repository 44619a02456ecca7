//! Lanes: which kinds are bulk work (a newsletter, a digest run) and which are
//! transactional (everything else). Bulk work never delays transactional work: while both
//! have due messages, a claim takes transactional messages first, and bulk gets what the
//! rate limit and the connections leave. The alert rules page on the transactional lane's
//! age; a bulk run at the pace is expected to be old.

use std::collections::BTreeSet;

use outboxd_producer::Kind;

/// A lane; its `as_str` is the `lane` label of the per-lane metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lane {
    Transactional,
    Bulk,
}

impl Lane {
    pub const ALL: [Lane; 2] = [Lane::Transactional, Lane::Bulk];

    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Transactional => "transactional",
            Lane::Bulk => "bulk",
        }
    }
}

/// The kinds of the bulk lane (`OUTBOXD_BULK_KINDS`); every other kind is transactional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lanes {
    bulk: BTreeSet<Kind>,
}

impl Lanes {
    /// Reads `newsletter,digest` (see [`parse_kinds`]).
    pub fn parse(text: &str) -> Result<Self, String> {
        Ok(Self {
            bulk: parse_kinds(text)?,
        })
    }

    /// The lanes with these kinds in bulk.
    pub fn of_bulk(bulk: BTreeSet<Kind>) -> Self {
        Self { bulk }
    }

    /// The bulk kinds.
    pub fn bulk(&self) -> impl Iterator<Item = &Kind> {
        self.bulk.iter()
    }

    pub fn of(&self, kind: &str) -> Lane {
        if self.bulk.contains(kind) {
            Lane::Bulk
        } else {
            Lane::Transactional
        }
    }

    /// The bulk kinds, as the claim binds them.
    pub fn bulk_kinds(&self) -> Vec<String> {
        self.bulk.iter().map(|kind| kind.as_str().to_owned()).collect()
    }
}

/// Reads `newsletter,digest`: kinds separated by commas, each a valid kind, none twice.
pub fn parse_kinds(text: &str) -> Result<BTreeSet<Kind>, String> {
    let mut kinds = BTreeSet::new();
    for kind in text.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        if !kinds.insert(Kind::parse(kind).map_err(|e| e.to_string())?) {
            return Err(format!("{kind:?} is given twice"));
        }
    }
    Ok(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_kinds_are_bulk_and_every_other_kind_is_transactional() {
        let lanes = Lanes::parse("newsletter, digest,").expect("valid kinds");
        assert_eq!(lanes.of("newsletter"), Lane::Bulk);
        assert_eq!(lanes.of("digest"), Lane::Bulk);
        assert_eq!(lanes.of("password_reset"), Lane::Transactional);
        assert_eq!(lanes.bulk_kinds(), ["digest", "newsletter"]);
        assert_eq!(Lanes::parse("").expect("empty"), Lanes::default());
    }

    #[test]
    fn a_kind_that_cannot_be_one_or_is_given_twice_is_refused() {
        for bad in ["News Letter", "../x", "a,a", ".hidden"] {
            assert!(Lanes::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
