//! The live page over real HTTP on loopback: the list, a run's page, its
//! stream pushing a new body when the run's files change, the token, and
//! names that are not runs.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use meshrun_serve::{bind, ServeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const T0: f64 = 1_796_248_566.0;

fn write_run(root: &Path, name: &str) -> std::path::PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("events.jsonl"),
        format!(
            "{}\n",
            serde_json::json!({"event": "attempt_started", "attempt": 1, "nprocs": 2, "hosts": 1, "control_addr": "127.0.0.1:1", "time": T0})
        ),
    )
    .unwrap();
    append_step(&dir, 1, 2.5);
    dir
}

fn append_step(dir: &Path, step: u64, loss: f64) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("metrics.jsonl"))
        .unwrap();
    let line = serde_json::json!({"time": T0 + step as f64, "attempt": 1, "step": step, "metrics": {"step": step, "loss": loss}});
    writeln!(f, "{line}").unwrap();
}

async fn serve(root: &Path, token: Option<&str>) -> SocketAddr {
    let (addr, server) = bind(ServeConfig {
        runs_dir: root.to_path_buf(),
        addr: "127.0.0.1:0".parse().unwrap(),
        token: token.map(String::from),
    })
    .await
    .unwrap();
    tokio::spawn(server);
    addr
}

/// (status, body) of a GET, addressed to the server's own address.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    get_as(addr, &addr.to_string(), path).await
}

/// (status, body) of a GET whose `Host:` is `host`.
async fn get_as(addr: SocketAddr, host: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

#[tokio::test]
async fn the_list_and_a_run_page_are_served_and_the_stream_pushes_each_change() {
    let root = tempfile::TempDir::new().unwrap();
    let run = write_run(root.path(), "gpt");
    let addr = serve(root.path(), None).await;

    let (status, list) = get(addr, "/").await;
    assert_eq!(status, 200);
    assert!(list.contains(r#"data-run="gpt""#), "{list}");
    assert!(list.contains("new EventSource(\"/stream\")"));
    let (status, page) = get(addr, "/runs/gpt").await;
    assert_eq!(status, 200);
    assert!(page.contains("<svg") && page.contains("new EventSource(\"/runs/gpt/stream\")"));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "nothing is loaded from elsewhere"
    );

    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET /runs/gpt/stream HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    append_step(&run, 2, 1.75);
    let mut seen = String::new();
    let mut buf = vec![0u8; 65536];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(seen.contains("event: update") && seen.contains("1.75")) {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .expect("an update within 10 s")
            .unwrap();
        assert!(n > 0, "the stream ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.contains("text/event-stream"), "{seen}");
}

#[tokio::test]
async fn a_server_with_a_token_refuses_requests_without_it_and_names_stay_in_the_folder() {
    let root = tempfile::TempDir::new().unwrap();
    write_run(root.path(), "gpt");
    let addr = serve(root.path(), Some("s3cret")).await;
    assert_eq!(get(addr, "/").await.0, 403);
    assert_eq!(get(addr, "/runs/gpt/stream").await.0, 403);
    let (status, list) = get(addr, "/?token=s3cret").await;
    assert_eq!(status, 200);
    assert!(
        list.contains("/runs/gpt?token=s3cret"),
        "links keep the token"
    );
    assert_eq!(get(addr, "/runs/..?token=s3cret").await.0, 404);
    assert_eq!(get(addr, "/runs/nosuch?token=s3cret").await.0, 404);
}

#[tokio::test]
async fn on_loopback_only_requests_addressed_to_loopback_are_answered() {
    // A page elsewhere that points a name of its own at 127.0.0.1 (DNS
    // rebinding) sends that name as the Host: it is refused, and says why.
    let root = tempfile::TempDir::new().unwrap();
    write_run(root.path(), "gpt");
    let addr = serve(root.path(), None).await;
    let port = addr.port();
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "localhost".to_string(),
    ] {
        assert_eq!(get_as(addr, &host, "/").await.0, 200, "{host}");
    }
    for path in ["/", "/stream", "/runs/gpt", "/runs/gpt/stream"] {
        let (status, body) = get_as(addr, &format!("rebound.example:{port}"), path).await;
        assert_eq!(status, 403, "{path}");
        assert!(
            body.contains(&format!("addressed to 'rebound.example:{port}'"))
                && body.contains("127.0.0.1, localhost or [::1]"),
            "{body}"
        );
    }
}
