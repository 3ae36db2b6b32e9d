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
//! on the first page, kept in the links and the streams).
//!
//! It reads the run folders and never writes them: the engine does not
//! depend on this crate, and a run goes on whether anybody watches.

mod pages;
mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
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
fn refused(shared: &Shared, access: &Access) -> Option<Response> {
    match &shared.token {
        Some(t) if access.token.as_deref() != Some(t.as_str()) => Some(
            (
                StatusCode::FORBIDDEN,
                "meshrun serve: this server needs its token: open the address it printed, with ?token=...",
            )
                .into_response(),
        ),
        _ => None,
    }
}

/// The folder of run `name`, when it is one (a name never leaves the runs
/// directory: it must be a plain folder name).
fn run_dir(shared: &Shared, name: &str) -> Option<PathBuf> {
    let plain = !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\']);
    let dir = shared.runs_dir.join(name);
    (plain && dir.is_dir()).then_some(dir)
}

async fn list_page(State(shared): State<Arc<Shared>>, Query(access): Query<Access>) -> Response {
    if let Some(no) = refused(&shared, &access) {
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
fn run_access(shared: &Shared, name: &str, access: &Access) -> Result<PathBuf, Box<Response>> {
    if let Some(no) = refused(shared, access) {
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
) -> Response {
    let dir = match run_access(&shared, &name, &access) {
        Ok(dir) => dir,
        Err(no) => return *no,
    };
    let page = pages::run_page(&dir);
    let stream = stream_url(&format!("/runs/{name}/stream"), access.token.as_deref());
    Html(pages::with_stream(&page, &stream)).into_response()
}

async fn list_stream(State(shared): State<Arc<Shared>>, Query(access): Query<Access>) -> Response {
    if let Some(no) = refused(&shared, &access) {
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
) -> Response {
    let dir = match run_access(&shared, &name, &access) {
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
