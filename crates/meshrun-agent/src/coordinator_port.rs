//! The port rank 0's `jax.distributed` coordinator will listen on, held
//! for the whole session.
//!
//! Picking a free port and letting it go leaves a window, from the pick
//! to the moment the coordinator binds it (seconds of imports, and again
//! at every restart), in which any other process's `bind(0)` or outgoing
//! connection may take it; rank 0 then cannot start its coordinator
//! (jaxlib crashes). So the agent keeps the port bound, not listening,
//! with `SO_REUSEPORT`: the kernel hands it to no one else, while the
//! coordinator's gRPC server, which binds with `SO_REUSEPORT` as gRPC
//! does by default on Linux, shares it. A socket that does not listen
//! receives no connections, so every one reaches the coordinator.

use std::io;
use std::net::{IpAddr, SocketAddr};

use tokio::net::TcpSocket;

/// A port bound (not listening) on `ip`, kept until dropped.
pub struct Reserved {
    _socket: TcpSocket,
    pub port: u16,
}

pub fn reserve(ip: IpAddr) -> io::Result<Reserved> {
    let socket = match ip {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseport(true)?;
    socket.bind(SocketAddr::new(ip, 0))?;
    let port = socket.local_addr()?.port();
    Ok(Reserved {
        _socket: socket,
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[tokio::test]
    async fn a_reserved_port_is_refused_to_others_and_shared_with_a_reuse_port_listener() {
        let reserved = reserve(LOOPBACK).unwrap();
        let at = SocketAddr::new(LOOPBACK, reserved.port);
        // Another process's plain bind (a port probe, or a server's).
        let err = std::net::TcpListener::bind(at).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        // The coordinator's: gRPC binds with SO_REUSEPORT.
        let coordinator = TcpSocket::new_v4().unwrap();
        coordinator.set_reuseport(true).unwrap();
        coordinator.bind(at).unwrap();
        let listener = coordinator.listen(8).unwrap();
        // Every connection reaches the listener, none the reservation.
        for _ in 0..16 {
            let client = tokio::net::TcpStream::connect(at).await.unwrap();
            let (accepted, from) = listener.accept().await.unwrap();
            assert_eq!(from, client.local_addr().unwrap());
            drop(accepted);
        }
    }
}
