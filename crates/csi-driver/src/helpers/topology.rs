//! Choosing where to provision from `accessibility_requirements`:
//! requisite restricts, preferred orders.

use csi_proto::v1::{Topology, TopologyRequirement};

use crate::error::CsiError;

/// Whether the driver segment `have` satisfies the requested `want`: every
/// key/value of `want` is in `have`.
pub fn topology_matches(have: &Topology, want: &Topology) -> bool {
    want.segments
        .iter()
        .all(|(k, v)| have.segments.get(k) == Some(v))
}

/// Picks one of `accessible` (the segments the driver can provision in, in
/// its own order of preference): it must match a requisite topology when
/// any is given; the first preferred topology that matches a candidate wins;
/// otherwise the first candidate. `Ok(None)` when the driver has no
/// topology at all. RESOURCE_EXHAUSTED when no segment fits.
pub fn select_topology(
    requirement: Option<&TopologyRequirement>,
    accessible: &[Topology],
) -> Result<Option<Topology>, CsiError> {
    if accessible.is_empty() {
        return Ok(None);
    }
    let (requisite, preferred) =
        requirement.map_or((&[][..], &[][..]), |r| (&r.requisite[..], &r.preferred[..]));
    let candidates: Vec<&Topology> = accessible
        .iter()
        .filter(|t| requisite.is_empty() || requisite.iter().any(|r| topology_matches(t, r)))
        .collect();
    if candidates.is_empty() {
        return Err(CsiError::ResourceExhausted(
            "no accessible topology satisfies the requisite topologies".into(),
        ));
    }
    let chosen = preferred
        .iter()
        .find_map(|p| candidates.iter().find(|c| topology_matches(c, p)))
        .unwrap_or(&candidates[0]);
    Ok(Some((*chosen).clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn zone(z: &str) -> Topology {
        Topology {
            segments: [("topology.example.com/zone".to_string(), z.to_string())].into(),
        }
    }

    #[test]
    fn table() {
        let have = [zone("a"), zone("b"), zone("c")];
        let req = |requisite: Vec<Topology>, preferred: Vec<Topology>| TopologyRequirement {
            requisite,
            preferred,
        };
        type Case = (Option<TopologyRequirement>, Result<Option<Topology>, Code>);
        let cases: Vec<Case> = vec![
            (None, Ok(Some(zone("a")))),
            (Some(req(vec![], vec![])), Ok(Some(zone("a")))),
            (
                Some(req(vec![zone("b"), zone("c")], vec![])),
                Ok(Some(zone("b"))),
            ),
            (
                Some(req(vec![zone("b"), zone("c")], vec![zone("c")])),
                Ok(Some(zone("c"))),
            ),
            (
                Some(req(vec![], vec![zone("x"), zone("c")])),
                Ok(Some(zone("c"))),
            ),
            (
                Some(req(vec![zone("x")], vec![])),
                Err(Code::ResourceExhausted),
            ),
            (
                Some(req(vec![Topology::default()], vec![])),
                Ok(Some(zone("a"))),
            ),
        ];
        for (r, want) in cases {
            let got = select_topology(r.as_ref(), &have).map_err(|e| e.code());
            assert_eq!(got, want, "{r:?}");
        }
        assert_eq!(
            select_topology(Some(&req(vec![zone("x")], vec![])), &[]),
            Ok(None)
        );
    }
}
