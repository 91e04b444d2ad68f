//! `lattice login` (the OIDC device flow or the manual paste flow; the token is cached for the
//! endpoint) and `lattice logout`.

use crate::login::Store;
use anyhow::{Context, Result, bail};

/// `lattice login --flow auto|device|manual --scope S` against the endpoint `base`.
/// How `lattice login` gets its tokens.
#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
pub enum Flow {
    /// The device flow when the IdP offers it, else the manual one.
    Auto,
    /// The device code flow: open the address shown anywhere, enter the code.
    Device,
    /// The manual paste flow: open the address shown, sign in, paste back the address the browser
    /// was sent to (or the code alone).
    Manual,
}

/// 64 bytes of the OS's entropy.
fn os_random() -> Result<[u8; 64]> {
    use std::io::Read;
    let mut b = [0u8; 64];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom")?;
    Ok(b)
}

pub fn login(agent: &ureq::Agent, base: &str, store: Option<Store>, scope: &str, flow: Flow) -> Result<()> {
    let d = crate::login::discover(agent, base)?;
    if d.mode == "none" {
        println!("{base} does not ask for authentication: nothing to log in to");
        return Ok(());
    }
    let (Some(idp), Some(client_id)) = (d.idp_url.or(d.issuer), d.client_id) else {
        bail!("{base}'s auth discovery names no IdP or client id (auth.idp_url, auth.client_id)");
    };
    let ep = crate::login::endpoints(agent, &idp)?;
    let manual = match flow {
        Flow::Manual => true,
        Flow::Device => false,
        Flow::Auto => ep.device_authorization_endpoint.is_none() && ep.authorization_endpoint.is_some(),
    };
    let entry = if manual {
        let redirect = d.redirect_uri.as_deref().unwrap_or(crate::login::DEFAULT_REDIRECT_URI);
        let m = crate::login::manual_start(&ep, &client_id, scope, redirect, &os_random()?)?;
        eprintln!("To log in, open this address in a browser and sign in:\n{}", m.url);
        eprintln!("Then paste the address your browser was sent to (or the code alone):");
        let mut pasted = String::new();
        std::io::stdin()
            .read_line(&mut pasted)
            .context("reading the pasted address")?;
        let code = crate::login::pasted_code(&m, &pasted)?;
        crate::login::manual_finish(agent, &ep, &client_id, &m, &code)?
    } else {
        crate::login::device_login(
            agent,
            &ep,
            &client_id,
            scope,
            |c| {
                eprintln!(
                    "To log in, open {} and enter the code {}",
                    c.verification_uri, c.user_code
                );
                if let Some(u) = &c.verification_uri_complete {
                    eprintln!("(or open {u})");
                }
            },
            std::thread::sleep,
        )?
    };
    let store = store.context("HOME is not set: nowhere to keep the token")?;
    let _turn = store.lock()?;
    let mut all = store.load()?;
    all.insert(base.to_string(), entry);
    store.save(&all)?;
    println!("Logged in to {base}");
    Ok(())
}

/// `lattice logout`: forgets `base`'s cached token and revokes it.
pub fn logout(agent: &ureq::Agent, base: &str, store: Option<Store>) -> Result<()> {
    let store = store.context("HOME is not set: no token cache")?;
    if crate::login::logout(agent, &store, base)? {
        println!("Logged out of {base}");
    } else {
        println!("Not logged in to {base}");
    }
    Ok(())
}
