//! The controller's listener with real connections: what a worker's
//! credential may say (its own hello, nothing else).

use std::net::SocketAddr;
use std::time::Duration;

use meshrun_channel::auth;
use meshrun_protocol::frame::encode;
use meshrun_protocol::token::{worker_key, Peer, Token};
use meshrun_protocol::{ClientRequest, FromAgent, FromWorker, ToWorker};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::{bind, spawn_accept_loop, Event};

async fn listening() -> (
    SocketAddr,
    Token,
    mpsc::Receiver<Event>,
    tokio::task::JoinHandle<()>,
) {
    let token = Token::generate().unwrap();
    let (listener, addr) = bind([127, 0, 0, 1].into(), 0).await.unwrap();
    let (tx, rx) = mpsc::channel(64);
    let task = spawn_accept_loop(listener, token.clone(), tx);
    (addr, token, rx, task)
}

#[tokio::test]
async fn a_workers_credential_says_its_own_hello_and_nothing_else() {
    let (addr, token, mut events, task) = listening().await;
    let me = Peer::Worker {
        attempt: 1,
        rank: 0,
    };
    let key = worker_key(&token, 1, 0);
    let not_its_own = [
        encode(&ClientRequest::StopRun { now: true }),
        encode(&FromAgent::AgentHello {
            host: None,
            host_ip: "127.0.0.1".into(),
            pid: 1,
            gpus: vec![],
            free_port: 1,
            controller: None,
            replica_port: None,
        }),
        encode(&FromWorker::WorkerHello {
            rank: 1,
            attempt: 1,
            pid: 1,
        }),
    ];
    for hello in not_its_own {
        let stream = TcpStream::connect(addr).await.unwrap();
        let mut conn = auth::connect_as(stream, &key, me).await.unwrap();
        conn.send_body(hello.clone()).await.unwrap();
        assert!(
            conn.recv_timeout::<ToWorker>(Duration::from_secs(5))
                .await
                .is_err(),
            "closed"
        );
        match events.recv().await {
            Some(Event::FrameRejected { reason, .. }) => assert_eq!(
                reason,
                "the credential of rank 0 in attempt 1 may only say that worker's hello"
            ),
            other => panic!("{hello:?} was taken: {other:?}"),
        }
    }
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut conn = auth::connect_as(stream, &key, me).await.unwrap();
    conn.send(&FromWorker::WorkerHello {
        rank: 0,
        attempt: 1,
        pid: 7,
    })
    .await
    .unwrap();
    assert!(matches!(
        events.recv().await,
        Some(Event::WorkerJoined {
            rank: 0,
            attempt: 1,
            pid: 7,
            ..
        })
    ));
    // As a holder of the run token (an agent, `meshrun stop`), the
    // credential does not even finish the handshake.
    let stream = TcpStream::connect(addr).await.unwrap();
    assert!(auth::connect(stream, &key).await.is_err());
    task.abort();
}
