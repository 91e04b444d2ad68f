//! Test-only injected bugs. The deterministic simulation (`lattice-dst`) must catch each; production
//! never sets one (every flag is off by default and no configuration turns one on).

/// Test-only injected bugs: the simulation must catch each (see `runtime/dst/tests/dst.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bugs {
    /// Acknowledge a submission once it is on the leader's own disk, without a majority's copies.
    pub ack_without_majority: bool,
    /// Agent hosts never fence: a cut-off agent keeps running work the control plane requeues.
    pub agent_no_fence: bool,
    /// A vCluster's weights change in the leader's memory only, never at the quorum.
    pub weights_leader_local: bool,
    /// A sensitive allocation's `release` is never written to the audit log.
    pub audit_drops_release: bool,
}

impl Bugs {
    pub fn parse(name: &str) -> Result<Bugs, String> {
        match name {
            "ack-without-majority" => Ok(Bugs {
                ack_without_majority: true,
                ..Bugs::default()
            }),
            "agent-no-fence" => Ok(Bugs {
                agent_no_fence: true,
                ..Bugs::default()
            }),
            "weights-leader-local" => Ok(Bugs {
                weights_leader_local: true,
                ..Bugs::default()
            }),
            "audit-drops-release" => Ok(Bugs {
                audit_drops_release: true,
                ..Bugs::default()
            }),
            other => Err(format!(
                "--bug: unknown `{other}` (known: ack-without-majority, agent-no-fence, weights-leader-local, audit-drops-release)"
            )),
        }
    }

    /// The bug's name on the command line (`None`: no bug).
    pub fn name(&self) -> Option<&'static str> {
        if self.ack_without_majority {
            Some("ack-without-majority")
        } else if self.agent_no_fence {
            Some("agent-no-fence")
        } else if self.weights_leader_local {
            Some("weights-leader-local")
        } else if self.audit_drops_release {
            Some("audit-drops-release")
        } else {
            None
        }
    }
}
