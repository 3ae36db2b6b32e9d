//! Framing: length prefix, version byte, JSON body. The same encoding is
//! used by the async side (controller, agent: tokio) and the blocking side
//! (the worker's thread inside the user's Python process).

use std::io::{self, Read, Write};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use super::message::Message;

/// Bumped whenever a [`Message`] changes incompatibly.
pub const PROTOCOL_VERSION: u8 = 1;

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
    #[error("expected {expected}, got another message")]
    Unexpected { expected: &'static str },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// Encodes a message as a frame body (version byte + JSON).
pub fn encode(msg: &Message) -> Bytes {
    let mut body = Vec::with_capacity(128);
    body.push(PROTOCOL_VERSION);
    // Serializing our own enum to a Vec cannot fail.
    serde_json::to_writer(&mut body, msg).expect("message serializes");
    Bytes::from(body)
}

/// Decodes a frame body; the caller has already enforced the size limit.
pub fn decode(body: &[u8]) -> Result<Message, ProtocolError> {
    let (&version, json) = body.split_first().ok_or(ProtocolError::Empty)?;
    if version != PROTOCOL_VERSION {
        return Err(ProtocolError::Version { seen: version });
    }
    Ok(serde_json::from_slice(json)?)
}

/// Turns what the codec yielded into a message or a protocol error.
fn next_message(item: Option<io::Result<BytesMut>>) -> Result<Message, ProtocolError> {
    match item {
        None => Err(ProtocolError::Closed),
        // The codec reports an oversized length prefix as invalid data.
        Some(Err(e)) if e.kind() == io::ErrorKind::InvalidData => {
            Err(ProtocolError::TooLarge(MAX_FRAME_BYTES + 1))
        }
        Some(Err(e)) => Err(e.into()),
        Some(Ok(body)) => decode(&body),
    }
}

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec()
}

/// An async framed connection (controller and agent side).
pub struct Connection {
    framed: Framed<TcpStream, LengthDelimitedCodec>,
}

impl Connection {
    pub fn new(stream: TcpStream) -> Self {
        let _ = stream.set_nodelay(true);
        Self {
            framed: Framed::new(stream, codec()),
        }
    }

    pub async fn send(&mut self, msg: &Message) -> Result<(), ProtocolError> {
        self.framed.send(encode(msg)).await?;
        Ok(())
    }

    /// The next message; [`ProtocolError::Closed`] at a clean end of stream.
    pub async fn recv(&mut self) -> Result<Message, ProtocolError> {
        next_message(self.framed.next().await)
    }

    pub async fn recv_timeout(&mut self, limit: Duration) -> Result<Message, ProtocolError> {
        tokio::time::timeout(limit, self.recv())
            .await
            .map_err(|_| ProtocolError::Timeout(limit))?
    }

    /// Splits into independent halves so reading and writing can run in
    /// separate tasks.
    pub fn split(self) -> (FrameSink, FrameStream) {
        let (sink, stream) = self.framed.split();
        (FrameSink(sink), FrameStream(stream))
    }
}

pub struct FrameSink(futures::stream::SplitSink<Framed<TcpStream, LengthDelimitedCodec>, Bytes>);
pub struct FrameStream(futures::stream::SplitStream<Framed<TcpStream, LengthDelimitedCodec>>);

impl FrameSink {
    pub async fn send(&mut self, msg: &Message) -> Result<(), ProtocolError> {
        self.0.send(encode(msg)).await?;
        Ok(())
    }
}

impl FrameStream {
    pub async fn recv(&mut self) -> Result<Message, ProtocolError> {
        next_message(self.0.next().await)
    }
}

/// Writes one frame to a blocking stream (worker side) without flushing,
/// so a burst of frames can share one system call.
pub fn put_frame(w: &mut impl Write, msg: &Message) -> Result<(), ProtocolError> {
    put_body(w, &encode(msg))
}

/// Buffers one frame of an already [`encode`]d body.
pub fn put_body(w: &mut impl Write, body: &[u8]) -> Result<(), ProtocolError> {
    if body.len() > MAX_FRAME_BYTES {
        return Err(ProtocolError::TooLarge(body.len()));
    }
    w.write_all(&(body.len() as u32).to_be_bytes())?;
    w.write_all(body)?;
    Ok(())
}

/// Writes one frame and flushes it.
pub fn write_frame(w: &mut impl Write, msg: &Message) -> Result<(), ProtocolError> {
    put_frame(w, msg)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame from a blocking stream (worker side).
pub fn read_frame(r: &mut impl Read) -> Result<Message, ProtocolError> {
    let mut len = [0u8; 4];
    if let Err(e) = r.read_exact(&mut len) {
        return Err(if e.kind() == io::ErrorKind::UnexpectedEof {
            ProtocolError::Closed
        } else {
            e.into()
        });
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(ProtocolError::TooLarge(len));
    }
    let mut body = BytesMut::zeroed(len);
    r.read_exact(&mut body)?;
    decode(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_blocking() {
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
        let mut buf = Vec::new();
        write_frame(&mut buf, &msg).unwrap();
        let back = read_frame(&mut buf.as_slice()).unwrap();
        assert_eq!(back, msg);
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
    fn oversized_length_is_refused_before_reading() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&(u32::MAX).to_be_bytes());
        assert!(matches!(
            read_frame(&mut buf.as_slice()),
            Err(ProtocolError::TooLarge(_))
        ));
    }

    #[test]
    fn truncated_frame_is_an_error() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Message::Heartbeat).unwrap();
        buf.truncate(buf.len() - 1);
        assert!(read_frame(&mut buf.as_slice()).is_err());
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
            let _ = read_frame(&mut bytes.as_slice());
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
