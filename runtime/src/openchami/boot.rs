//! One node's boots through OpenCHAMI: the drift flag in SMD, a sensitive claim's hardened boot and
//! a released sensitive node's secure wipe. Each returns what its outcome makes the control plane
//! decide; the caller ([`crate::effects`]) carries that out.

use super::BootImage;
use crate::context::{Shared, sleep_unless_stopped};
use lattice_adapters::openchami::OpenChami;
use lattice_control::world::Action;
use std::sync::Arc;

/// Flags a drifted node in SMD (or clears the flag), retried while OpenCHAMI is down (book:
/// "OpenCHAMI Unavailable": operations are queued and retried).
pub async fn flag_drift(s: Arc<Shared>, oc: Arc<OpenChami>, node: String, drifted: bool, message: String) {
    let (flag, msg) = if drifted {
        ("Warning", message.as_str())
    } else {
        ("OK", "")
    };
    let mut wait = std::time::Duration::from_secs(1);
    let mut stopped = s.stopped.clone();
    loop {
        match oc.flag(&node, flag, msg).await {
            Ok(()) => return,
            Err(e) => tracing::warn!("{node}: flagging the drift in SMD: {e} (retrying)"),
        }
        if !sleep_unless_stopped(&mut stopped, wait).await {
            return;
        }
        wait = (wait * 2).min(std::time::Duration::from_secs(60));
    }
}

/// Boots one node of a committed sensitive claim into the hardened image through OpenCHAMI (book:
/// "OpenCHAMI boots N1-N4 with hardened sensitive image (if not already)"): a node whose BSS
/// parameters already name the image is done at once; otherwise its SMD software status is set to
/// `BootPending`, BSS pointed at the image and the node rebooted through PCS, then SMD is polled
/// until the image reports `Hardened` (booted) or `BootFailed`. OpenCHAMI being down is retried
/// until the control plane stops waiting (the claim ended, or `sensitive.boot_timeout` ran out:
/// the node is then out and the claim failed).
pub async fn harden(s: Arc<Shared>, oc: Arc<OpenChami>, image: BootImage, claim: String, node: String) -> Vec<Action> {
    let poll = std::time::Duration::from_millis(lattice_traces::parse_duration(&image.poll).map_or(5_000, |d| d.0));
    let awaited = || async { s.control.lock().await.boot_awaited(&claim, &node) };
    let pause = |d| {
        let mut st = s.stopped.clone();
        async move { sleep_unless_stopped(&mut st, d).await }
    };
    let params = lattice_adapters::openchami::BootParams {
        kernel: image.kernel.clone(),
        initrd: image.initrd.clone(),
        params: image.params.clone(),
    };
    let ok = loop {
        let started = async {
            if oc.boot_params(&node).await?.as_ref() == Some(&params) {
                return Ok::<_, lattice_adapters::http::HttpError>(true);
            }
            oc.software_status(&node, "BootPending").await?;
            oc.set_boot_params(&node, &params).await?;
            oc.restart(&node).await?;
            Ok(false)
        }
        .await;
        match started {
            Ok(true) => break Some(true),
            Ok(false) => break None,
            Err(e) => tracing::warn!("{node}: booting the hardened image for {claim}: {e} (retrying)"),
        }
        if !pause(poll).await || !awaited().await {
            return Vec::new();
        }
    };
    let ok = match ok {
        Some(ok) => ok,
        None => {
            tracing::info!("{node}: OpenCHAMI boots the hardened image for {claim}");
            loop {
                if !pause(poll).await || !awaited().await {
                    return Vec::new();
                }
                match oc.component(&node).await {
                    Ok(c) => match c.software_status.as_deref() {
                        Some("Hardened") => break true,
                        Some("BootFailed") => break false,
                        _ => {}
                    },
                    Err(e) => tracing::warn!("{node}: asking SMD for the hardened boot's outcome: {e}"),
                }
            }
        }
    };
    let mut c = s.control.lock().await;
    c.node_booted(&claim, &node, ok);
    c.take_actions()
}

/// The secure wipe of one released sensitive node through OpenCHAMI (book: "Sensitive Release
/// Sequence"): its SMD software status set to `WipePending`, BSS pointed at the wipe image, a PCS
/// reboot; then SMD is polled until the image reports `Wiped` or `WipeFailed`, and the node's
/// previous boot parameters are restored with another reboot (into the clean image). The outcome
/// goes to the control plane (a wiped node returns to the pool, a failed one is quarantined);
/// OpenCHAMI being down is retried until the control plane's `sensitive.wipe_timeout` gives up on
/// the node (quarantined, "no wipe confirmation").
pub async fn wipe(s: Arc<Shared>, oc: Arc<OpenChami>, image: BootImage, claim: String, node: String) -> Vec<Action> {
    let poll = std::time::Duration::from_millis(lattice_traces::parse_duration(&image.poll).map_or(5_000, |d| d.0));
    let awaited = || async { s.control.lock().await.wipe_awaited(&claim, &node) };
    let pause = |d| {
        let mut st = s.stopped.clone();
        async move { sleep_unless_stopped(&mut st, d).await }
    };
    // Start it (retried while OpenCHAMI does not answer).
    let wipe_params = lattice_adapters::openchami::BootParams {
        kernel: image.kernel.clone(),
        initrd: image.initrd.clone(),
        params: image.params.clone(),
    };
    let previous = loop {
        let started = async {
            let prev = oc.boot_params(&node).await?;
            oc.software_status(&node, "WipePending").await?;
            oc.set_boot_params(&node, &wipe_params).await?;
            oc.restart(&node).await?;
            Ok::<_, lattice_adapters::http::HttpError>(prev)
        }
        .await;
        match started {
            Ok(prev) => break prev,
            Err(e) => tracing::warn!("{node}: starting the OpenCHAMI wipe for {claim}: {e} (retrying)"),
        }
        if !pause(poll).await || !awaited().await {
            return Vec::new();
        }
    };
    tracing::info!("{node}: OpenCHAMI wipes it for {claim}");
    // Wait for the wipe image's verdict.
    let ok = loop {
        if !pause(poll).await || !awaited().await {
            break None;
        }
        match oc.component(&node).await {
            Ok(c) => match c.software_status.as_deref() {
                Some("Wiped") => break Some(true),
                Some("WipeFailed") => break Some(false),
                _ => {}
            },
            Err(e) => tracing::warn!("{node}: asking SMD for the wipe's outcome: {e}"),
        }
    };
    // Back to the node's own image, whatever happened (a quarantined node reboots into it too).
    if let Some(p) = previous {
        for _ in 0..5 {
            let restored = async {
                oc.set_boot_params(&node, &p).await?;
                oc.restart(&node).await
            }
            .await;
            match restored {
                Ok(_) => break,
                Err(e) => tracing::warn!("{node}: restoring its boot parameters: {e} (retrying)"),
            }
            if !pause(poll).await {
                break;
            }
        }
    }
    let Some(ok) = ok else {
        // Given up by the control plane (timeout): already quarantined.
        return Vec::new();
    };
    let reason = (!ok).then(|| "the OpenCHAMI wipe image reported WipeFailed".to_string());
    let mut c = s.control.lock().await;
    c.node_wiped(&claim, &node, ok, reason);
    c.take_actions()
}
