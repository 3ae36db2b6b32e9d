//! `meshrun serve`: a local web server for the runs of a runs directory.
//!
//! - `/` lists the runs (state, attempts, step, loss), and updates itself;
//! - `/runs/NAME` is the run's report page (the same renderer as `meshrun
//!   report`, `meshrun_report::html`), and updates itself while the run
//!   goes on;
//! - `/runs/NAME/stream` and `/stream` are their server-sent events: each
//!   time the run folder's files change (checked every
//!   [`watch::POLL`]), the page's new body.
//!
//! The pages load nothing from elsewhere: the report's charts are inline
//! SVG and the one script is inline. The server binds 127.0.0.1 unless
//! told otherwise; bound to another address it requires a token (`?token=`
//! on the first page, kept in the links and the streams). On loopback it
//! answers only requests addressed to a loopback name (`Host:`), so that a
//! web page elsewhere cannot read the runs through a DNS name it points at
//! 127.0.0.1 (DNS rebinding).
//!
//! It reads the run folders and never writes them: the engine does not
//! depend on this crate, and a run goes on whether anybody watches.

mod pages;
mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::Stream;
use serde::Deserialize;

/// What can stop the server from serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the server stopped: {0}")]
    Serve(#[source] std::io::Error),
}

/// Where to serve from, and who may look.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub runs_dir: PathBuf,
    pub addr: SocketAddr,
    /// Required of every request when set (the server is then reachable
    /// from other machines).
    pub token: Option<String>,
}

struct Shared {
    runs_dir: PathBuf,
    token: Option<String>,
    /// Bound to a loopback address: requests must name a loopback host.
    loopback: bool,
}

#[derive(Deserialize)]
struct Access {
    token: Option<String>,
}

/// Binds `cfg.addr` and returns the address bound (a port of 0 is chosen
/// by the system) and the server, to be awaited.
pub async fn bind(
    cfg: ServeConfig,
) -> Result<
    (
        SocketAddr,
        impl std::future::Future<Output = Result<(), ServeError>>,
    ),
    ServeError,
> {
    let listener = tokio::net::TcpListener::bind(cfg.addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: cfg.addr,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: cfg.addr,
        source,
    })?;
    let app = router(Arc::new(Shared {
        runs_dir: cfg.runs_dir,
        token: cfg.token,
        loopback: bound.ip().is_loopback(),
    }));
    Ok((bound, async move {
        axum::serve(listener, app).await.map_err(ServeError::Serve)
    }))
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(list_page))
        .route("/stream", get(list_stream))
        .route("/runs/{name}", get(run_page))
        .route("/runs/{name}/stream", get(run_stream))
        .with_state(shared)
}

/// `None` when the request may go on, else the answer that refuses it.
fn refused(shared: &Shared, access: &Access, headers: &HeaderMap) -> Option<Response> {
    if shared.loopback {
        let host = headers
            .get(header::HOST)
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
        if !host.as_deref().is_some_and(is_loopback_host) {
            return Some(
                (
                    StatusCode::FORBIDDEN,
                    format!(
                        "meshrun serve: this server answers only requests addressed to 127.0.0.1, localhost or [::1]; this one was addressed to {}",
                        host.map_or_else(|| "no host".to_string(), |h| format!("'{h}'"))
                    ),
                )
                    .into_response(),
            );
        }
    }
    match &shared.token {
        Some(t) if !access.token.as_deref().is_some_and(|given| same(given, t)) => Some(
            (
                StatusCode::FORBIDDEN,
                "meshrun serve: this server needs its token: open the address it printed, with ?token=...",
            )
                .into_response(),
        ),
        _ => None,
    }
}

/// Whether a `Host:` header names this machine's loopback: `127.x.y.z`,
/// `localhost` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Compares a given token with the server's in time that does not depend
/// on where they first differ.
fn same(given: &str, token: &str) -> bool {
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The folder of run `name`, when it is one (a name never leaves the runs
/// directory: it must be a plain folder name).
fn run_dir(shared: &Shared, name: &str) -> Option<PathBuf> {
    let plain = !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\']);
    let dir = shared.runs_dir.join(name);
    (plain && dir.is_dir()).then_some(dir)
}

async fn list_page(
    State(shared): State<Arc<Shared>>,
    Query(access): Query<Access>,
    headers: HeaderMap,
) -> Response {
    if let Some(no) = refused(&shared, &access, &headers) {
        return no;
    }
    let body = pages::list_body(&shared.runs_dir, access.token.as_deref());
    Html(pages::live(
        "meshrun runs",
        &body,
        &stream_url("/stream", access.token.as_deref()),
    ))
    .into_response()
}

/// The folder of run `name` for a request that may see it, or the answer
/// that refuses the request.
fn run_access(
    shared: &Shared,
    name: &str,
    access: &Access,
    headers: &HeaderMap,
) -> Result<PathBuf, Box<Response>> {
    if let Some(no) = refused(shared, access, headers) {
        return Err(Box::new(no));
    }
    run_dir(shared, name).ok_or_else(|| {
        Box::new((StatusCode::NOT_FOUND, format!("no run named '{name}' here")).into_response())
    })
}

async fn run_page(
    State(shared): State<Arc<Shared>>,
    UrlPath(name): UrlPath<String>,
    Query(access): Query<Access>,
    headers: HeaderMap,
) -> Response {
    let dir = match run_access(&shared, &name, &access, &headers) {
        Ok(dir) => dir,
        Err(no) => return *no,
    };
    let page = pages::run_page(&dir);
    let stream = stream_url(&format!("/runs/{name}/stream"), access.token.as_deref());
    Html(pages::with_stream(&page, &stream)).into_response()
}

async fn list_stream(
    State(shared): State<Arc<Shared>>,
    Query(access): Query<Access>,
    headers: HeaderMap,
) -> Response {
    if let Some(no) = refused(&shared, &access, &headers) {
        return no;
    }
    let runs_dir = shared.runs_dir.clone();
    let token = access.token.clone();
    updates(runs_dir.clone(), move || {
        pages::list_body(&runs_dir, token.as_deref())
    })
    .into_response()
}

async fn run_stream(
    State(shared): State<Arc<Shared>>,
    UrlPath(name): UrlPath<String>,
    Query(access): Query<Access>,
    headers: HeaderMap,
) -> Response {
    let dir = match run_access(&shared, &name, &access, &headers) {
        Ok(dir) => dir,
        Err(no) => return *no,
    };
    let watched = dir.clone();
    updates(watched, move || pages::body_of(&pages::run_page(&dir))).into_response()
}

/// An event with `render()` each time the files under `watched` change.
fn updates(
    watched: PathBuf,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>> {
    let stream = futures::stream::unfold(
        (watch::fingerprint(&watched), watched, render),
        |(mut seen, watched, render)| async move {
            loop {
                tokio::time::sleep(watch::POLL).await;
                let now = watch::fingerprint(&watched);
                if now != seen {
                    seen = now;
                    let event = Event::default().event("update").data(render());
                    return Some((Ok(event), (seen, watched, render)));
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

fn stream_url(path: &str, token: Option<&str>) -> String {
    match token {
        Some(t) => format!("{path}?token={t}"),
        None => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_are_told_from_others() {
        for host in [
            "127.0.0.1:8070",
            "127.0.0.1",
            "127.1.2.3:80",
            "localhost:8070",
            "LOCALHOST",
            "[::1]:8070",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example:8070",
            "evil.example",
            "10.0.0.1:8070",
            "localhost.evil.example",
            "[::2]:8070",
            "",
            "127.0.0.1.evil.example",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abcd", "abcd"));
        assert!(!same("abce", "abcd"));
        assert!(!same("abc", "abcd"));
        assert!(!same("", "abcd"));
    }
}
