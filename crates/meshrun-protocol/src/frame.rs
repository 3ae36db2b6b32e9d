//! Frame bodies: one version byte, then the JSON of a [`Message`]. The same
//! encoding is used by the async side (controller, agent: tokio) and the
//! blocking side (the worker's thread inside the user's Python process);
//! on the wire each body travels sealed by `meshrun-channel`.

use std::io;
use std::time::Duration;

use bytes::Bytes;

use super::message::Message;

/// Bumped whenever a [`Message`] or the wire format changes incompatibly.
/// It is also bound into the handshake, so peers of two versions cannot
/// open a connection at all.
pub const PROTOCOL_VERSION: u8 = 8;

/// No honest frame is near this: a log line is cut at 64 KiB, a metrics
/// record is small. Anything larger is an attack or a bug.
pub const MAX_FRAME_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("connection closed")]
    Closed,
    #[error("connection error: {0}")]
    Io(#[from] io::Error),
    #[error("frame of {0} bytes is over the limit of {MAX_FRAME_BYTES}")]
    TooLarge(usize),
    #[error("empty frame")]
    Empty,
    #[error("protocol version {seen} is not supported (this meshrun speaks {PROTOCOL_VERSION})")]
    Version { seen: u8 },
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("authentication failed: {0}")]
    Auth(&'static str),
    /// A frame after the handshake that does not open with the
    /// connection's keys: altered, replayed, reordered, cut short or
    /// recorded on another connection. The connection is closed.
    #[error("frame rejected: {0}")]
    Rejected(&'static str),
    #[error("expected {expected}, got another message")]
    Unexpected { expected: &'static str },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// The first byte of a frame that carries bytes of a file in transfer
/// ([`Message::Raw`]) rather than a versioned JSON message: file data
/// crosses without JSON or base64.
pub const RAW_TAG: u8 = 0xff;

/// Encodes a message as a frame body (version byte + JSON).
pub fn encode(msg: &Message) -> Bytes {
    if let Message::Raw(data) = msg {
        let mut body = Vec::with_capacity(data.len() + 1);
        body.push(RAW_TAG);
        body.extend_from_slice(data);
        return Bytes::from(body);
    }
    let mut body = Vec::with_capacity(128);
    body.push(PROTOCOL_VERSION);
    // Serializing our own enum to a Vec cannot fail.
    serde_json::to_writer(&mut body, msg).expect("message serializes");
    Bytes::from(body)
}

/// Decodes a frame body; the caller has already enforced the size limit.
pub fn decode(body: &[u8]) -> Result<Message, ProtocolError> {
    let (&version, json) = body.split_first().ok_or(ProtocolError::Empty)?;
    if version == RAW_TAG {
        return Ok(Message::Raw(Bytes::copy_from_slice(json)));
    }
    if version != PROTOCOL_VERSION {
        return Err(ProtocolError::Version { seen: version });
    }
    Ok(serde_json::from_slice(json)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let msg = Message::Report {
            step: Some(3),
            metrics: serde_json::json!({"loss": 0.5}),
            checkpoint: false,
            timing: Some(meshrun_record::Timing {
                now: 1.5,
                ..Default::default()
            }),
            saving: true,
            total_steps: Some(10),
        };
        assert_eq!(decode(&encode(&msg)).unwrap(), msg);
    }

    #[test]
    fn raw_bytes_cross_as_they_are() {
        let msg = Message::Raw(Bytes::from_static(b"\x00\xffdata"));
        let body = encode(&msg);
        assert_eq!(body.len(), 7);
        assert_eq!(decode(&body).unwrap(), msg);
    }

    #[test]
    fn wrong_version_is_refused() {
        let mut body = encode(&Message::Heartbeat).to_vec();
        body[0] = 99;
        assert!(matches!(
            decode(&body),
            Err(ProtocolError::Version { seen: 99 })
        ));
    }

    #[test]
    fn an_empty_body_is_refused() {
        assert!(matches!(decode(&[]), Err(ProtocolError::Empty)));
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn versioned_garbage_is_malformed_not_a_panic(
            json in proptest::collection::vec(any::<u8>(), 0..256)
        ) {
            let mut body = vec![PROTOCOL_VERSION];
            body.extend(json);
            let _ = decode(&body);
        }
    }
}
