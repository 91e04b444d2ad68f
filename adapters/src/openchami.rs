//! The OpenCHAMI client (book: "Bootstrap Sequence", "Node Conformance", "Sensitive Node Lifecycle"):
//! SMD (the State Management Daemon, `/hsm/v2`) for the node inventory — components, their state and
//! flag, and groups — and for flagging drifted nodes; BSS (the Boot Script Service, `/boot/v1`) for
//! the image a node boots; PCS (power control, `/power-control/v1`) to reboot one.

use crate::http::{Http, HttpConfig, HttpError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// One SMD component (`/hsm/v2/State/Components`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Component {
    /// The xname, e.g. `x1000c0s0b0n0`.
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Type", default)]
    pub kind: String,
    /// `Ready`, `On`, `Off`, `Standby`, `Halt`, `Empty`, `Populated`, `Unknown`.
    #[serde(default)]
    pub state: String,
    /// `OK`, `Warning`, `Alert`, `Locked`.
    #[serde(default)]
    pub flag: String,
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub role: Option<String>,
    /// Set by the boot image (e.g. `Wiped` by the secure-wipe image).
    #[serde(default)]
    pub software_status: Option<String>,
    #[serde(rename = "NID", default)]
    pub nid: Option<u64>,
}

impl Component {
    /// SMD says the node can run work: powered and healthy, enabled, not flagged `Alert`.
    pub fn usable(&self) -> bool {
        matches!(self.state.as_str(), "Ready" | "On") && self.enabled != Some(false) && self.flag != "Alert"
    }
}

/// One SMD group (`/hsm/v2/groups`): a label and its member xnames.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub label: String,
    #[serde(default)]
    pub members: Members,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Members {
    #[serde(default)]
    pub ids: Vec<String>,
}

/// What BSS boots a node with.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BootParams {
    #[serde(default)]
    pub kernel: String,
    #[serde(default)]
    pub initrd: String,
    #[serde(default)]
    pub params: String,
}

pub struct OpenChami {
    smd: Http,
    bss: Http,
    pcs: Http,
}

impl OpenChami {
    /// SMD, BSS and PCS at their own bases (often one gateway for all three).
    pub fn new(smd: HttpConfig, bss: HttpConfig, pcs: HttpConfig) -> Result<OpenChami, HttpError> {
        Ok(OpenChami {
            smd: Http::new(smd)?,
            bss: Http::new(bss)?,
            pcs: Http::new(pcs)?,
        })
    }

    /// The node components SMD knows.
    pub async fn nodes(&self) -> Result<Vec<Component>, HttpError> {
        let v = self
            .smd
            .call(reqwest::Method::GET, "/hsm/v2/State/Components?type=Node", None)
            .await?;
        decode(&v["Components"], "/hsm/v2/State/Components")
    }

    /// One component.
    pub async fn component(&self, xname: &str) -> Result<Component, HttpError> {
        let path = format!("/hsm/v2/State/Components/{xname}");
        let v = self.smd.call(reqwest::Method::GET, &path, None).await?;
        decode(&v, &path)
    }

    pub async fn groups(&self) -> Result<Vec<Group>, HttpError> {
        let v = self.smd.call(reqwest::Method::GET, "/hsm/v2/groups", None).await?;
        decode(&v, "/hsm/v2/groups")
    }

    /// Flags a component (`Warning` with a message for a drifted node; `OK` clears it).
    pub async fn flag(&self, xname: &str, flag: &str, message: &str) -> Result<(), HttpError> {
        let body = json!({"Flag": flag, "FlagMsg": message});
        let path = format!("/hsm/v2/State/Components/{xname}");
        self.smd.call(reqwest::Method::PATCH, &path, Some(&body)).await?;
        Ok(())
    }

    /// Sets a component's software status (`WipePending` before a secure wipe).
    pub async fn software_status(&self, xname: &str, status: &str) -> Result<(), HttpError> {
        let body = json!({"SoftwareStatus": status});
        let path = format!("/hsm/v2/State/Components/{xname}");
        self.smd.call(reqwest::Method::PATCH, &path, Some(&body)).await?;
        Ok(())
    }

    /// What `xname` boots.
    pub async fn boot_params(&self, xname: &str) -> Result<Option<BootParams>, HttpError> {
        let path = format!("/boot/v1/bootparameters?name={xname}");
        let v = self.bss.call(reqwest::Method::GET, &path, None).await?;
        let all: Vec<BootParams> = decode(&v, "/boot/v1/bootparameters")?;
        Ok(all.into_iter().next())
    }

    /// Makes `xname` boot `p` from its next boot.
    pub async fn set_boot_params(&self, xname: &str, p: &BootParams) -> Result<(), HttpError> {
        let body = json!({"hosts": [xname], "kernel": p.kernel, "initrd": p.initrd, "params": p.params});
        self.bss
            .call(reqwest::Method::PUT, "/boot/v1/bootparameters", Some(&body))
            .await?;
        Ok(())
    }

    /// Reboots `xname` (PCS `Hard-Restart`); the transition's id.
    pub async fn restart(&self, xname: &str) -> Result<String, HttpError> {
        let body = json!({"operation": "Hard-Restart", "location": [{"xname": xname}]});
        let v = self
            .pcs
            .call(reqwest::Method::POST, "/power-control/v1/transitions", Some(&body))
            .await?;
        Ok(v["transitionID"].as_str().unwrap_or_default().to_string())
    }
}

fn decode<T: serde::de::DeserializeOwned>(v: &Value, path: &str) -> Result<T, HttpError> {
    serde_json::from_value(v.clone()).map_err(|e| HttpError::Decode {
        method: "GET".into(),
        url: path.into(),
        message: e.to_string(),
    })
}
