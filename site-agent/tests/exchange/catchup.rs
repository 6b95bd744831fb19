//! The catch-up transfer over mTLS: a site fetches a state with the
//! certificate of the site it claims; a certificate of another site
//! claiming it is refused before the store is asked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use longhaul_exchange::catchup::CatchUpRequest;
use longhaul_site_agent::catchup::{
    CatchUpError, CatchUpOptions, CatchUpServer, StateStore, fetch,
};

use crate::Pki;

#[tokio::test]
async fn only_the_certificate_of_the_site_named_fetches_its_state() {
    let pki = Pki::new("catch-up test CA");
    let store = StateStore::new();
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let options = CatchUpOptions {
        handshake_timeout: Duration::from_secs(5),
        wait: Duration::from_millis(200),
        ..CatchUpOptions::default()
    };
    let server =
        CatchUpServer::bind(loopback, &pki.agent("north"), Arc::clone(&store), options).unwrap();
    let addr = server.local_addr().unwrap();
    let state: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    store.publish("chars", 7, state.clone());
    store.allow("chars", 7, "south");
    let request = CatchUpRequest {
        job: "chars".into(),
        site: "south".into(),
        round: 7,
        elements: 1000,
    };
    let client = quinn::Endpoint::client(loopback).unwrap();
    let deadline = Duration::from_secs(20);
    let fetched = fetch(
        &client,
        &pki.agent("south"),
        "north",
        addr,
        &request,
        deadline,
    )
    .await
    .unwrap();
    assert_eq!(fetched, state);
    // East's certificate, claiming to be south: refused, naming why.
    let error = fetch(
        &client,
        &pki.agent("east"),
        "north",
        addr,
        &request,
        deadline,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, CatchUpError::Refused(ref reason) if reason.contains("south")),
        "{error}"
    );
    // A server whose certificate does not name the site asked for.
    let error = fetch(
        &client,
        &pki.agent("south"),
        "west",
        addr,
        &request,
        deadline,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, CatchUpError::Connect { .. }), "{error}");
}
