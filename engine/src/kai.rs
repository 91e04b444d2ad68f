//! Hierarchical fair share, KAI scheduler style (`../shared/seeds/004_*.txt`): every queue (tenant, then
//! project inside it) gets its *deserved* quota up to what it requests; what remains is shared among the
//! queues that still want more in proportion to their *over-quota weight*, round after round. Each level
//! divides its parent's fair share the same way.
//!
//! Why this scheme rather than Slurm's Fair Tree: it is demand-aware (an idle tenant's share flows to
//! the busy ones by weight, the way Lattice's vClusters are soft boundaries), and it yields the
//! saturation ratio `allocated / fair share` that reclaim decisions rank by. The seeds hold no worked
//! Fair Tree example to reproduce; the KAI pseudo-code's own semantics are the tests below.

/// One queue of the hierarchy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueSpec {
    pub name: String,
    /// Guaranteed resources (nodes).
    pub deserved: f64,
    /// Weight for sharing what is left after deserved quotas.
    pub over_quota_weight: f64,
    /// What the queue asks for now (running + waiting).
    pub request: f64,
    pub children: Vec<QueueSpec>,
}

/// Fair shares of a hierarchy: `(path, fair share)` for every queue, depth first (`tenant/project`).
pub fn fair_shares(total: f64, queues: &[QueueSpec]) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    divide(total, queues, "", &mut out);
    out
}

fn divide(total: f64, queues: &[QueueSpec], prefix: &str, out: &mut Vec<(String, f64)>) {
    let shares = one_level(total, queues);
    for (q, share) in queues.iter().zip(shares) {
        let path = if prefix.is_empty() {
            q.name.clone()
        } else {
            format!("{prefix}/{}", q.name)
        };
        out.push((path.clone(), share));
        if !q.children.is_empty() {
            divide(share, &q.children, &path, out);
        }
    }
}

/// The seed's algorithm for one level: deserved first, then over-quota rounds by weight.
pub fn one_level(total: f64, queues: &[QueueSpec]) -> Vec<f64> {
    let mut fair: Vec<f64> = queues.iter().map(|q| q.deserved.min(q.request).max(0.0)).collect();
    let mut remaining = total - fair.iter().sum::<f64>();
    // Each round either satisfies a queue's request or hands out everything left.
    for _ in 0..=queues.len() {
        if remaining <= 1e-12 {
            break;
        }
        let wanting: Vec<usize> = (0..queues.len())
            .filter(|&i| queues[i].request - fair[i] > 1e-12 && queues[i].over_quota_weight > 0.0)
            .collect();
        let total_w: f64 = wanting.iter().map(|&i| queues[i].over_quota_weight).sum();
        if wanting.is_empty() || total_w <= 0.0 {
            break;
        }
        let pot = remaining;
        for &i in &wanting {
            let give = (pot * queues[i].over_quota_weight / total_w).min(queues[i].request - fair[i]);
            fair[i] += give;
            remaining -= give;
        }
    }
    fair
}

/// Saturation ratio `allocated / fair share` (∞ when the fair share is 0 and something is allocated):
/// the higher, the likelier a queue's workloads are reclaimed.
pub fn saturation(allocated: f64, fair_share: f64) -> f64 {
    if fair_share > 0.0 {
        allocated / fair_share
    } else if allocated > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, deserved: f64, weight: f64, request: f64) -> QueueSpec {
        QueueSpec {
            name: name.into(),
            deserved,
            over_quota_weight: weight,
            request,
            children: Vec::new(),
        }
    }

    /// Worked through the seed's pseudo-code: 100 nodes; A deserves 30 (weight 1, asks 80), B 30 (weight
    /// 3, asks 50), C 40 (weight 1, asks 10).
    /// - deserved: A 30, B 30, C 10 (its request) → 30 left.
    /// - round 1 (A and B still want more; weights 1 and 3): A +7.5, B +min(22.5, 20) = +20 → 2.5 left.
    /// - round 2 (only A wants more): A +2.5.
    ///
    /// Fair shares: A 40, B 50, C 10 — C's unused deserved quota went to the others by weight.
    #[test]
    fn deserved_then_over_quota_by_weight() {
        let f = one_level(
            100.0,
            &[
                q("A", 30.0, 1.0, 80.0),
                q("B", 30.0, 3.0, 50.0),
                q("C", 40.0, 1.0, 10.0),
            ],
        );
        assert_eq!(f, vec![40.0, 50.0, 10.0]);
    }

    /// Deserved quota is always given (up to the request), even when weights are zero; nothing is handed
    /// out beyond the requests.
    #[test]
    fn deserved_is_guaranteed_and_requests_cap() {
        let f = one_level(100.0, &[q("A", 60.0, 0.0, 70.0), q("B", 10.0, 1.0, 15.0)]);
        assert_eq!(f, vec![60.0, 15.0]);
        let f = one_level(100.0, &[q("A", 0.0, 1.0, 0.0), q("B", 0.0, 1.0, 0.0)]);
        assert_eq!(f, vec![0.0, 0.0]);
    }

    /// Hierarchy: a tenant's fair share is divided among its projects the same way.
    #[test]
    fn hierarchy_divides_the_parent_share() {
        let mut physics = q("physics", 50.0, 1.0, 90.0);
        physics.children = vec![q("lattice-qcd", 30.0, 1.0, 80.0), q("astro", 10.0, 1.0, 10.0)];
        let bio = q("bio", 50.0, 1.0, 20.0);
        let f = fair_shares(100.0, &[physics, bio]);
        // physics: 50 deserved + 30 of bio's unused share (only physics wants more) = 80.
        assert_eq!(f[0], ("physics".to_string(), 80.0));
        // inside physics' 80: qcd 30 + astro 10, then qcd takes the 40 left (astro asks no more).
        assert_eq!(f[1], ("physics/lattice-qcd".to_string(), 70.0));
        assert_eq!(f[2], ("physics/astro".to_string(), 10.0));
        assert_eq!(f[3], ("bio".to_string(), 20.0));
        assert_eq!(saturation(90.0, 80.0), 1.125);
    }
}
