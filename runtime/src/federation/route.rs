//! The broker's routing recommendation (book: "Job Routing Logic"): a pure function of the request
//! and what the catalog says about each site (this one included). It suggests; the chosen site's
//! own scheduler decides.
//!
//! Per site, in this order:
//! - **Sovereignty** excludes: a sensitive request never leaves this site, and data a site's
//!   catalog marks sensitive is used only there ("never transferred, no exceptions").
//! - **Authorization** excludes: the site's policy must accept the request's tenant.
//! - **Unreachable** peers (no catalog for [`super::FederationConfig::unreachable_after`]) are excluded.
//! - **Capacity**: a site with fewer nodes (of the GPU type) than asked is excluded; otherwise
//!   `min(1, available / asked)`.
//! - **Data gravity**: the share of the request's input bytes the site holds (0.5 without data);
//!   for `--site=auto`, a site that would need more than [`LARGE_DATA_GB`] moved is excluded.
//! - **Energy**: `1 − normalised price` over the candidates' prices (0.5 when unknown or all equal).
//!
//! Score = `w_data·gravity + w_capacity·capacity + w_energy·energy`, halved for a stale peer and
//! halved for a degraded one (deprioritised, not excluded). The best score wins; ties go to this site,
//! then by name.

use serde::{Deserialize, Serialize};

/// Data above this much (GB) should not be moved to run elsewhere (book: "Cross-Site Data Access").
pub const LARGE_DATA_GB: f64 = 1000.0;

/// The routing weights (`federation.weights`).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Weights {
    pub data_gravity: f64,
    pub capacity: f64,
    pub energy: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            data_gravity: 0.5,
            capacity: 0.3,
            energy: 0.2,
        }
    }
}

/// How a peer looks from here (book: "Catalog Consistency and Staleness").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PeerStatus {
    Healthy,
    /// The last request or catalog fetch failed; healthy again at the next success.
    Degraded,
    /// No catalog for twice the sync interval.
    Stale,
    /// No catalog for `unreachable_after` (24 h): out of routing.
    Unreachable,
}

/// A dataset a site's catalog lists (a mount source prefix, e.g. `s3://climate/era5`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Dataset {
    pub name: String,
    #[serde(default)]
    pub size_gb: f64,
    /// Sensitive data: it never leaves this site.
    #[serde(default)]
    pub sensitive: bool,
}

/// One site as routing sees it.
#[derive(Clone, Debug)]
pub struct Site {
    pub name: String,
    pub local: bool,
    pub status: PeerStatus,
    pub nodes: u32,
    pub available_nodes: u32,
    /// Nodes by GPU type.
    pub gpu_types: Vec<(String, u32)>,
    pub energy_price: Option<f64>,
    pub datasets: Vec<Dataset>,
    /// Its policy accepts the request's tenant.
    pub authorized: bool,
    pub uenvs: Vec<String>,
    /// Its catalog has come (a peer just added may not have sent one yet).
    pub known: bool,
}

/// What is being routed.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub nodes: u32,
    pub gpu_type: Option<String>,
    pub sensitive: bool,
    /// Input data: (mount source, size in GB when known).
    pub data: Vec<(String, Option<f64>)>,
    pub uenv: Option<String>,
}

/// Where the user asked it to run.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    Auto,
    Site(String),
}

/// One site's score, or why it was left out.
#[derive(Clone, Debug, Serialize, PartialEq, schemars::JsonSchema)]
pub struct Score {
    pub site: String,
    pub total: f64,
    pub data_gravity: f64,
    pub capacity: f64,
    pub energy: f64,
    pub status: PeerStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub excluded: Option<String>,
}

/// The recommendation.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(tag = "decision", content = "site", rename_all = "lowercase")]
pub enum Decision {
    Local,
    Remote(String),
    Reject(String),
}

/// The routing's answer: the decision, every site's score and warnings for the user.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Routing {
    pub decision: Decision,
    pub scores: Vec<Score>,
    pub warnings: Vec<String>,
}

/// Each input's size in GB: the request's, else the largest a catalog lists for it, else 1 GB (it
/// counts, but little).
fn sizes(req: &Request, sites: &[Site]) -> Vec<f64> {
    req.data
        .iter()
        .map(|(source, size)| {
            let listed = sites
                .iter()
                .flat_map(|s| &s.datasets)
                .filter(|d| source.starts_with(d.name.as_str()))
                .map(|d| d.size_gb)
                .reduce(f64::max);
            size.or(listed).unwrap_or(1.0).max(0.0)
        })
        .collect()
}

/// Where the request's data is: the share of its bytes `site` holds, the GB it lacks, and whether a
/// dataset there is sensitive.
fn gravity(req: &Request, gbs: &[f64], site: &Site) -> (f64, f64, Vec<String>) {
    if req.data.is_empty() {
        return (0.5, 0.0, Vec::new());
    }
    let mut total = 0.0;
    let mut here = 0.0;
    let mut missing = 0.0;
    let mut sensitive = Vec::new();
    for ((source, _), gb) in req.data.iter().zip(gbs) {
        let held = site.datasets.iter().find(|d| source.starts_with(d.name.as_str()));
        let gb = *gb;
        total += gb;
        match held {
            Some(d) => {
                here += gb;
                if d.sensitive {
                    sensitive.push(source.clone());
                }
            }
            None => missing += gb,
        }
    }
    let share = if total > 0.0 { here / total } else { 0.5 };
    (share, missing, sensitive)
}

/// Routes `req` over `sites` (exactly one of them local).
pub fn route(req: &Request, sites: &[Site], target: &Target, w: &Weights) -> Routing {
    let mut warnings = Vec::new();
    let gbs = sizes(req, sites);
    // Sensitive data held somewhere pins the request to that site.
    let pinned: Vec<(&str, Vec<String>)> = sites
        .iter()
        .map(|s| (s.name.as_str(), gravity(req, &gbs, s).2))
        .filter(|(_, d)| !d.is_empty())
        .collect();
    let prices: Vec<f64> = sites.iter().filter_map(|s| s.energy_price).collect();
    let (lo, hi) = prices.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        (lo.min(*p), hi.max(*p))
    });
    let mut scores = Vec::with_capacity(sites.len());
    for s in sites {
        let (g, missing_gb, _) = gravity(req, &gbs, s);
        let fitting = match &req.gpu_type {
            Some(t) => s.gpu_types.iter().filter(|(g, _)| g == t).map(|(_, n)| *n).sum(),
            None => s.nodes,
        };
        let capacity = if fitting < req.nodes.max(1) {
            0.0
        } else {
            (s.available_nodes as f64 / req.nodes.max(1) as f64).min(1.0)
        };
        let energy = match s.energy_price {
            Some(p) if hi > lo => 1.0 - (p - lo) / (hi - lo),
            _ => 0.5,
        };
        let excluded = if req.sensitive && !s.local {
            Some("sensitive workloads run at their home site (data sovereignty)".to_string())
        } else if let Some((home, d)) = pinned.iter().find(|(home, _)| *home != s.name) {
            Some(format!("sensitive data {} stays at {home}", d.join(", ")))
        } else if !s.known {
            Some("no catalog from it yet".to_string())
        } else if !s.authorized {
            Some("the site's policy does not accept this tenant".to_string())
        } else if s.status == PeerStatus::Unreachable {
            Some("unreachable (no catalog for too long)".to_string())
        } else if fitting < req.nodes.max(1) {
            Some(match &req.gpu_type {
                Some(t) => format!("has {fitting} {t} node(s), {} asked", req.nodes),
                None => format!("has {fitting} node(s), {} asked", req.nodes),
            })
        } else if *target == Target::Auto && !s.local && missing_gb > LARGE_DATA_GB {
            Some(format!("would need {:.0} GB of input data moved", missing_gb))
        } else {
            None
        };
        let mut total = w.data_gravity * g + w.capacity * capacity + w.energy * energy;
        if matches!(s.status, PeerStatus::Stale) {
            total *= 0.5;
        }
        if matches!(s.status, PeerStatus::Degraded) {
            total *= 0.5;
        }
        scores.push(Score {
            site: s.name.clone(),
            total: if excluded.is_some() { 0.0 } else { total },
            data_gravity: g,
            capacity,
            energy,
            status: s.status,
            excluded,
        });
    }
    let decision = match target {
        Target::Site(name) => match sites.iter().zip(&scores).find(|(s, _)| s.name == *name) {
            None => Decision::Reject(format!("no federation peer {name}")),
            Some((_, sc)) if sc.excluded.is_some() => {
                Decision::Reject(format!("{name}: {}", sc.excluded.clone().unwrap_or_default()))
            }
            Some((s, _)) if s.local => Decision::Local,
            Some((s, sc)) => {
                let missing = gravity(req, &gbs, s).1;
                if missing > LARGE_DATA_GB {
                    warnings.push(format!(
                        "{name} lacks {missing:.0} GB of the input data; it runs better where the data is"
                    ));
                }
                if sc.status != PeerStatus::Healthy {
                    warnings.push(format!("{name} is {:?} in the catalog", sc.status).to_lowercase());
                }
                Decision::Remote(name.clone())
            }
        },
        Target::Auto => {
            let best = sites
                .iter()
                .zip(&scores)
                .filter(|(_, sc)| sc.excluded.is_none())
                // Highest score; ties: this site, then by name.
                .max_by(|(a, x), (b, y)| {
                    x.total
                        .total_cmp(&y.total)
                        .then(a.local.cmp(&b.local))
                        .then(b.name.cmp(&a.name))
                });
            match best {
                None => {
                    let mut why: Vec<String> = scores
                        .iter()
                        .map(|s| format!("{}: {}", s.site, s.excluded.clone().unwrap_or_default()))
                        .collect();
                    why.sort();
                    Decision::Reject(why.join("; "))
                }
                Some((s, _)) if s.local => Decision::Local,
                Some((s, _)) => Decision::Remote(s.name.clone()),
            }
        }
    };
    if let (Decision::Remote(name), Some(u)) = (&decision, &req.uenv)
        && let Some(s) = sites.iter().find(|s| s.name == *name)
        && !s.uenvs.iter().any(|x| x == u)
    {
        warnings.push(format!(
            "{name}'s catalog does not list uenv {u}; it may pull it from a shared registry"
        ));
    }
    Routing {
        decision,
        scores,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn site(name: &str, local: bool) -> Site {
        Site {
            name: name.into(),
            local,
            status: PeerStatus::Healthy,
            nodes: 8,
            available_nodes: 8,
            gpu_types: vec![("GH200".into(), 8)],
            energy_price: Some(0.2),
            datasets: Vec::new(),
            authorized: true,
            uenvs: Vec::new(),
            known: true,
        }
    }

    fn req(nodes: u32) -> Request {
        Request {
            nodes,
            ..Request::default()
        }
    }

    fn auto(r: &Request, sites: &[Site]) -> Decision {
        route(r, sites, &Target::Auto, &Weights::default()).decision
    }

    #[test]
    fn data_gravity_pulls_the_job_to_its_data() {
        let a = site("a", true);
        let mut b = site("b", false);
        b.datasets.push(Dataset {
            name: "s3://climate/era5".into(),
            size_gb: 500.0,
            sensitive: false,
        });
        let mut r = req(2);
        r.data.push(("s3://climate/era5/2020".into(), None));
        assert_eq!(auto(&r, &[a.clone(), b.clone()]), Decision::Remote("b".into()));
        // Without data, equal sites: this one.
        assert_eq!(auto(&req(2), &[a, b]), Decision::Local);
    }

    #[test]
    fn cheaper_energy_wins_when_all_else_is_equal() {
        let a = site("a", true);
        let mut b = site("b", false);
        b.energy_price = Some(0.05);
        assert_eq!(auto(&req(1), &[a.clone(), b.clone()]), Decision::Remote("b".into()));
        // ... but not over a full site (capacity).
        b.available_nodes = 0;
        assert_eq!(auto(&req(4), &[a, b]), Decision::Local);
    }

    #[test]
    fn sensitive_work_and_sensitive_data_never_leave() {
        let a = site("a", true);
        let mut b = site("b", false);
        b.energy_price = Some(0.0);
        let mut r = req(1);
        r.sensitive = true;
        assert_eq!(auto(&r, &[a.clone(), b.clone()]), Decision::Local);
        let explicit = route(
            &r,
            &[a.clone(), b.clone()],
            &Target::Site("b".into()),
            &Weights::default(),
        );
        assert!(matches!(explicit.decision, Decision::Reject(ref m) if m.contains("sovereignty")));
        // Sensitive data held at b: only b, even when asked for here.
        let mut b2 = b.clone();
        b2.datasets.push(Dataset {
            name: "s3://hospital/".into(),
            size_gb: 1.0,
            sensitive: true,
        });
        let mut r2 = req(1);
        r2.data.push(("s3://hospital/scans".into(), Some(1.0)));
        let here = route(
            &r2,
            &[a.clone(), b2.clone()],
            &Target::Site("a".into()),
            &Weights::default(),
        );
        assert!(matches!(here.decision, Decision::Reject(ref m) if m.contains("stays at b")));
    }

    #[test]
    fn unauthorized_unreachable_and_too_small_sites_are_excluded() {
        let a = site("a", true);
        let mut b = site("b", false);
        b.energy_price = Some(0.0);
        b.authorized = false;
        assert_eq!(auto(&req(1), &[a.clone(), b.clone()]), Decision::Local);
        b.authorized = true;
        b.status = PeerStatus::Unreachable;
        assert_eq!(auto(&req(1), &[a.clone(), b.clone()]), Decision::Local);
        b.status = PeerStatus::Healthy;
        let mut r = req(1);
        r.gpu_type = Some("MI300A".into());
        let none = route(&r, &[a, b], &Target::Auto, &Weights::default());
        assert!(
            matches!(none.decision, Decision::Reject(ref m) if m.contains("0 MI300A")),
            "{none:?}"
        );
    }

    #[test]
    fn stale_and_degraded_peers_are_deprioritised_not_excluded() {
        let a = site("a", true);
        let mut b = site("b", false);
        b.energy_price = Some(0.0);
        assert_eq!(auto(&req(1), &[a.clone(), b.clone()]), Decision::Remote("b".into()));
        b.status = PeerStatus::Stale;
        assert_eq!(auto(&req(1), &[a.clone(), b.clone()]), Decision::Local);
        // Still reachable when asked for by name.
        let r = route(&req(1), &[a, b], &Target::Site("b".into()), &Weights::default());
        assert_eq!(r.decision, Decision::Remote("b".into()));
        assert!(r.warnings.iter().any(|w| w.contains("stale")));
    }

    #[test]
    fn large_data_is_not_moved_by_auto_routing() {
        let mut a = site("a", true);
        a.available_nodes = 0;
        a.datasets.push(Dataset {
            name: "s3://big/".into(),
            size_gb: 5000.0,
            sensitive: false,
        });
        let mut b = site("b", false);
        b.energy_price = Some(0.0);
        let mut r = req(1);
        r.data.push(("s3://big/set".into(), None));
        assert_eq!(auto(&r, &[a.clone(), b.clone()]), Decision::Local);
        // Asked for by name: it goes, with a warning.
        let named = route(&r, &[a, b], &Target::Site("b".into()), &Weights::default());
        assert_eq!(named.decision, Decision::Remote("b".into()));
        assert!(named.warnings.iter().any(|w| w.contains("5000 GB")));
    }

    proptest! {
        /// Whatever the catalog says: a sensitive request is never routed away, an excluded site is
        /// never chosen, and the answer does not depend on the order the sites are listed in.
        #[test]
        fn routing_respects_exclusions_and_is_order_free(
            prices in proptest::collection::vec(proptest::option::of(0.0f64..1.0), 3),
            avail in proptest::collection::vec(0u32..10, 3),
            authorized in proptest::collection::vec(any::<bool>(), 3),
            status in proptest::collection::vec(0u8..4, 3),
            nodes in 1u32..10,
            sensitive in any::<bool>(),
        ) {
            let mut sites: Vec<Site> = (0..3).map(|i| {
                let mut s = site(&format!("s{i}"), i == 0);
                s.energy_price = prices[i];
                s.available_nodes = avail[i];
                s.authorized = authorized[i] || i == 0;
                s.status = [PeerStatus::Healthy, PeerStatus::Degraded, PeerStatus::Stale, PeerStatus::Unreachable][status[i] as usize];
                if i == 0 { s.status = PeerStatus::Healthy; }
                s
            }).collect();
            let mut r = req(nodes);
            r.sensitive = sensitive;
            let out = route(&r, &sites, &Target::Auto, &Weights::default());
            if sensitive {
                prop_assert!(!matches!(out.decision, Decision::Remote(_)));
            }
            if let Decision::Remote(name) = &out.decision {
                let sc = out.scores.iter().find(|s| s.site == *name).unwrap();
                prop_assert!(sc.excluded.is_none());
                prop_assert!(sc.status != PeerStatus::Unreachable);
            }
            sites.reverse();
            prop_assert_eq!(route(&r, &sites, &Target::Auto, &Weights::default()).decision, out.decision);
        }
    }
}
