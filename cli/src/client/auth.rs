//! `lattice login` (the OIDC device flow; the token is cached for the endpoint) and `lattice logout`.

use crate::login::Store;
use anyhow::{Context, Result, bail};

/// `lattice login --flow device --scope S` against the endpoint `base`.
pub fn login(agent: &ureq::Agent, base: &str, store: Option<Store>, scope: &str) -> Result<()> {
    let d = crate::login::discover(agent, base)?;
    if d.mode == "none" {
        println!("{base} does not ask for authentication: nothing to log in to");
        return Ok(());
    }
    let (Some(idp), Some(client_id)) = (d.idp_url.or(d.issuer), d.client_id) else {
        bail!("{base}'s auth discovery names no IdP or client id (auth.idp_url, auth.client_id)");
    };
    let ep = crate::login::endpoints(agent, &idp)?;
    let entry = crate::login::device_login(
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
    )?;
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
