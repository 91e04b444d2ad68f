//! The client's configuration: `~/.config/lattice/config.yaml`, the HTTP agent (site CA, client
//! certificate), and `lattice config`.

use super::Client;
use anyhow::{Context, Result, bail};
use std::path::PathBuf;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub endpoint: Option<String>,
    /// The quorum's members (requests move on from one that is down or not the leader).
    pub endpoints: Option<Vec<String>>,
    pub tenant: Option<String>,
    /// The vCluster submissions go to when `--vcluster` is not given.
    pub vcluster: Option<String>,
    pub token: Option<String>,
    pub ca: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// `~/.config/lattice/config.yaml` (absent is fine), or the file `--config` names (it must exist);
/// unreadable or invalid is an error naming it.
pub fn file_config(given: Option<&std::path::Path>) -> Result<FileConfig> {
    let path = match given {
        Some(p) => {
            if !p.is_file() {
                bail!("--config {}: no such file", p.display());
            }
            p.to_path_buf()
        }
        None => {
            let Some(home) = std::env::var_os("HOME") else {
                return Ok(FileConfig::default());
            };
            let path = PathBuf::from(home).join(".config/lattice/config.yaml");
            if !path.exists() {
                return Ok(FileConfig::default());
            }
            path
        }
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    yaml_serde::from_str(&text).with_context(|| format!("{}", path.display()))
}

/// The HTTP agent: the site CA and client certificate when configured (rustls, ring).
pub fn http_agent(fc: &FileConfig) -> Result<ureq::Agent> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
    let path = |env: &str, file: &Option<PathBuf>| std::env::var_os(env).map(PathBuf::from).or(file.clone());
    let read = |what: &str, p: &PathBuf| std::fs::read(p).with_context(|| format!("{what}: reading {}", p.display()));
    let mut tls = TlsConfig::builder().provider(TlsProvider::Rustls);
    if let Some(ca) = path("LATTICE_CA", &fc.ca) {
        let pem = read("ca", &ca)?;
        let certs = ureq::tls::parse_pem(&pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("ca: {}", ca.display()))?;
        tls = tls.root_certs(RootCerts::new_with_certs(&certs));
    }
    match (
        path("LATTICE_CLIENT_CERT", &fc.client_cert),
        path("LATTICE_CLIENT_KEY", &fc.client_key),
    ) {
        (Some(c), Some(k)) => {
            let cert = Certificate::from_pem(&read("client_cert", &c)?)
                .with_context(|| format!("client_cert: {}", c.display()))?;
            let key = PrivateKey::from_pem(&read("client_key", &k)?)
                .with_context(|| format!("client_key: {}", k.display()))?;
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&[cert], key)));
        }
        (None, None) => {}
        _ => {
            bail!("a client certificate needs both client_cert and client_key (LATTICE_CLIENT_CERT/LATTICE_CLIENT_KEY)")
        }
    }
    Ok(ureq::Agent::config_builder()
        .tls_config(tls.build())
        .http_status_as_error(false)
        // A connection idle longer than common servers keep one (Node.js and Apache close theirs
        // after 5 s) is not reused: a request on one the server is closing meets an EOF, and a
        // refresh (the refresh token is spent once sent) cannot be retried after that.
        .max_idle_age(std::time::Duration::from_secs(4))
        .build()
        .into())
}

/// `lattice config`: each setting and where it comes from (`endpoint_flag`, `tenant_flag`: given as
/// `--endpoint`, `--tenant`; `given`: the `--config` file).
pub fn show(
    client: &Client,
    tenant: &Option<String>,
    (endpoint_flag, tenant_flag): (bool, bool),
    given: Option<&std::path::Path>,
) -> Result<()> {
    let file = match given {
        Some(p) => Some(p.to_path_buf()),
        None => std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".config/lattice/config.yaml"))
            .filter(|p| p.exists()),
    };
    let from = |env: &'static str, flag: bool, in_file: bool| -> &'static str {
        if flag {
            "flag"
        } else if std::env::var_os(env).is_some() {
            env
        } else if in_file {
            "config file"
        } else {
            "default"
        }
    };
    let fc = file_config(given)?;
    println!(
        "config file: {}",
        file.as_ref().map_or("(none)".into(), |p| p.display().to_string())
    );
    println!(
        "endpoint:    {} ({})",
        client.endpoints.join(","),
        from(
            "LATTICE_ENDPOINT",
            endpoint_flag,
            fc.endpoint.is_some() || fc.endpoints.is_some()
        )
    );
    println!(
        "tenant:      {} ({})",
        tenant.as_deref().unwrap_or("(none)"),
        from("LATTICE_TENANT", tenant_flag, fc.tenant.is_some())
    );
    println!(
        "vcluster:    {}",
        fc.vcluster.as_deref().unwrap_or("(the tenant's default)")
    );
    println!(
        "token:       {} ({})",
        if client.token().is_some() { "set" } else { "none" },
        from("LATTICE_TOKEN", false, fc.token.is_some())
    );
    for (name, env, v) in [
        ("ca", "LATTICE_CA", &fc.ca),
        ("client_cert", "LATTICE_CLIENT_CERT", &fc.client_cert),
        ("client_key", "LATTICE_CLIENT_KEY", &fc.client_key),
    ] {
        let shown = std::env::var_os(env)
            .map(PathBuf::from)
            .or(v.clone())
            .map_or("(none)".into(), |p| p.display().to_string());
        println!("{name:<12} {shown}");
    }
    Ok(())
}
