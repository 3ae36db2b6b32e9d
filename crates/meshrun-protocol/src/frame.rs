//! Frame bodies: one version byte, then the JSON of a message ([`Frame`]:
//! each conversation's enums of `message`). The same
//! encoding is used by the async side (controller, agent: tokio) and the
//! blocking side (the worker's thread inside the user's Python process);
//! on the wire each body travels sealed by `meshrun-channel`.

use std::io;
use std::time::Duration;

use bytes::Bytes;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::message::{
    ClientReply, ClientRequest, FromAgent, FromWorker, ReplicaReply, ReplicaRequest, ToAgent,
    ToWorker,
};

/// Bumped whenever a message or the wire format changes incompatibly.
/// It is also bound into the handshake, so peers of two versions cannot
/// open a connection at all.
pub const PROTOCOL_VERSION: u8 = 12;

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
/// (a `Raw` message) rather than a versioned JSON message: file data
/// crosses without JSON or base64.
pub const RAW_TAG: u8 = 0xff;

/// A message of one conversation and direction, as it crosses in a frame.
/// The enums that carry files (`FromWorker`, the replicas') have a `Raw`
/// variant, sent without JSON.
pub trait Frame: Serialize + DeserializeOwned {
    /// The bytes of a file in transfer, when the message is one.
    fn raw(&self) -> Option<&Bytes> {
        None
    }

    /// The message a raw frame is, where the conversation has them.
    fn from_raw(_data: Bytes) -> Option<Self> {
        None
    }
}

macro_rules! frames {
    ($($t:ty),*) => { $(impl Frame for $t {})* };
    (raw: $($t:ident),*) => {
        $(impl Frame for $t {
            fn raw(&self) -> Option<&Bytes> {
                match self {
                    $t::Raw(data) => Some(data),
                    _ => None,
                }
            }

            fn from_raw(data: Bytes) -> Option<Self> {
                Some($t::Raw(data))
            }
        })*
    };
}

frames!(FromAgent, ToAgent, ClientRequest, ClientReply, ToWorker);
frames!(raw: FromWorker, ReplicaRequest, ReplicaReply);

/// Encodes a message as a frame body (version byte + JSON).
pub fn encode<M: Frame>(msg: &M) -> Bytes {
    if let Some(data) = msg.raw() {
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

/// As [`decode`], from a body already held as [`Bytes`]: a raw frame's
/// data is a slice of it, not a copy.
pub fn decode_bytes<M: Frame>(body: &Bytes) -> Result<M, ProtocolError> {
    if body.first() == Some(&RAW_TAG) {
        return M::from_raw(body.slice(1..)).ok_or(ProtocolError::Unexpected {
            expected: "a message, not the bytes of a file",
        });
    }
    decode(body)
}

/// Decodes a frame body as a message of `M`'s conversation; the caller
/// has already enforced the size limit.
pub fn decode<M: Frame>(body: &[u8]) -> Result<M, ProtocolError> {
    let (&version, json) = body.split_first().ok_or(ProtocolError::Empty)?;
    if version == RAW_TAG {
        return M::from_raw(Bytes::copy_from_slice(json)).ok_or(ProtocolError::Unexpected {
            expected: "a message, not the bytes of a file",
        });
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
        let msg = FromWorker::Report {
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
        assert_eq!(decode::<FromWorker>(&encode(&msg)).unwrap(), msg);
    }

    #[test]
    fn raw_bytes_cross_as_they_are() {
        let msg = FromWorker::Raw(Bytes::from_static(b"\x00\xffdata"));
        let body = encode(&msg);
        assert_eq!(body.len(), 7);
        assert_eq!(decode::<FromWorker>(&body).unwrap(), msg);
        // A conversation without files takes none.
        assert!(matches!(
            decode::<ToWorker>(&body),
            Err(ProtocolError::Unexpected { .. })
        ));
    }

    #[test]
    fn a_frame_of_one_conversation_is_not_read_as_anothers() {
        let bye = encode(&FromWorker::Bye);
        assert!(matches!(
            decode::<ToAgent>(&bye),
            Err(ProtocolError::Malformed(_))
        ));
        let stop = encode(&ClientRequest::StopRun { now: true });
        assert!(decode::<FromAgent>(&stop).is_err());
        assert_eq!(
            decode::<ClientRequest>(&stop).unwrap(),
            ClientRequest::StopRun { now: true }
        );
    }

    #[test]
    fn wrong_version_is_refused() {
        let mut body = encode(&FromWorker::Heartbeat).to_vec();
        body[0] = 99;
        assert!(matches!(
            decode::<FromWorker>(&body),
            Err(ProtocolError::Version { seen: 99 })
        ));
    }

    #[test]
    fn an_empty_body_is_refused() {
        assert!(matches!(
            decode::<FromAgent>(&[]),
            Err(ProtocolError::Empty)
        ));
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<FromWorker>(&bytes);
            let _ = decode::<ToAgent>(&bytes);
        }

        #[test]
        fn versioned_garbage_is_malformed_not_a_panic(
            json in proptest::collection::vec(any::<u8>(), 0..256)
        ) {
            let mut body = vec![PROTOCOL_VERSION];
            body.extend(json);
            let _ = decode::<FromAgent>(&body);
        }
    }
}
