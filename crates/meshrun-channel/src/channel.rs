//! The encrypted channel a control connection becomes once its handshake
//! ([`crate::auth`]) is done. Every frame body (`meshrun_protocol::frame`) is sealed
//! with the connection's Noise transport keys, so nothing crosses the
//! network in the clear and every frame is authenticated.
//!
//! On the wire a frame is one or more pieces, each a Noise transport
//! message (at most 65,535 bytes, its 16-byte tag included) behind a 2-byte
//! big-endian length. A piece's plaintext is a slice of the body and one
//! more byte, 1 when more pieces of the same frame follow and 0 on its
//! last: a frame of up to [`MAX_FRAME_BYTES`] fits in 17 pieces, and since
//! that byte is sealed with the data, a frame cannot be cut short unseen.
//! Each direction seals its pieces with consecutive nonces, so a piece that
//! is altered, dropped, replayed or reordered fails its tag, and so does one
//! recorded on another connection (its keys came from other ephemeral keys).
//! Any such piece is [`ProtocolError::Rejected`]; its connection is over.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use snow::StatelessTransportState;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, Encoder, FramedRead, FramedWrite};

use meshrun_protocol::frame::{decode, decode_bytes, encode, ProtocolError, MAX_FRAME_BYTES};
use meshrun_protocol::Frame;

/// Noise's limit on one message, tag included.
pub const MAX_PIECE_BYTES: usize = 65_535;
/// ChaCha20-Poly1305's tag.
const TAG_BYTES: usize = 16;
/// Body bytes one piece carries: all the message but its tag and the
/// more-follows byte.
const PIECE_DATA_BYTES: usize = MAX_PIECE_BYTES - TAG_BYTES - 1;
const MORE: u8 = 1;
const LAST: u8 = 0;

/// The blocking writer sends what it has sealed once this much is waiting,
/// as a `BufWriter` would, so a long burst of frames is not held in memory.
const WRITE_AT: usize = 64 * 1024;

/// Buffers are kept between frames up to this size; one grown by a large
/// frame is given back.
const KEEP_BYTES: usize = 64 * 1024;

/// The transport keys of one connection, from its handshake.
pub struct Keys(StatelessTransportState);

impl Keys {
    pub(super) fn new(state: StatelessTransportState) -> Self {
        Self(state)
    }

    /// The sending and the receiving half. Each counts its own nonces, and
    /// a nonce must never seal two pieces: that is why the keys are
    /// consumed here, once.
    pub fn split(self) -> (Sealer, Opener) {
        let keys = Arc::new(self.0);
        let sealer = Sealer {
            keys: Arc::clone(&keys),
            nonce: 0,
            piece: Vec::new(),
        };
        let opener = Opener {
            keys,
            nonce: 0,
            body: Vec::new(),
            complete: false,
        };
        (sealer, opener)
    }

    /// The halves over a blocking stream (the worker's side): `reader` and
    /// `writer` are usually one socket and its `try_clone`.
    pub fn into_blocking<R: Read, W: Write>(
        self,
        reader: R,
        writer: W,
    ) -> (BlockingReader<R>, BlockingWriter<W>) {
        let (sealer, opener) = self.split();
        (
            BlockingReader {
                opener,
                input: reader,
                piece: Vec::new(),
            },
            BlockingWriter {
                sealer,
                output: writer,
                buf: Vec::new(),
            },
        )
    }
}

/// A buffer sealed pieces are appended to (the blocking writer's `Vec`,
/// the codec's `BytesMut`).
trait Grow {
    /// Appends `n` zero bytes and returns them.
    fn grow(&mut self, n: usize) -> &mut [u8];
}

impl Grow for Vec<u8> {
    fn grow(&mut self, n: usize) -> &mut [u8] {
        let start = self.len();
        self.resize(start + n, 0);
        &mut self[start..]
    }
}

impl Grow for BytesMut {
    fn grow(&mut self, n: usize) -> &mut [u8] {
        let start = self.len();
        self.resize(start + n, 0);
        &mut self[start..]
    }
}

/// Seals frame bodies into pieces.
pub struct Sealer {
    keys: Arc<StatelessTransportState>,
    nonce: u64,
    /// One piece's plaintext: the body's slice and the more-follows byte.
    piece: Vec<u8>,
}

impl Sealer {
    /// Appends the wire form of one frame body to `out`; a body over the
    /// frame limit appends nothing.
    fn seal(&mut self, body: &[u8], out: &mut impl Grow) -> Result<(), ProtocolError> {
        if body.len() > MAX_FRAME_BYTES {
            return Err(ProtocolError::TooLarge(body.len()));
        }
        let pieces = body.len().div_ceil(PIECE_DATA_BYTES).max(1);
        for i in 0..pieces {
            let data = &body[i * PIECE_DATA_BYTES..body.len().min((i + 1) * PIECE_DATA_BYTES)];
            self.piece.clear();
            self.piece.extend_from_slice(data);
            self.piece.push(if i + 1 < pieces { MORE } else { LAST });
            let len = self.piece.len() + TAG_BYTES;
            let dst = out.grow(2 + len);
            dst[..2].copy_from_slice(&(len as u16).to_be_bytes());
            // The piece is within Noise's limit and `dst` is its size; the
            // only other failure is a nonce past 2^64 - 2 pieces.
            self.keys
                .write_message(self.nonce, &self.piece, &mut dst[2..])
                .expect("a piece within the limit seals");
            self.nonce += 1;
        }
        if self.piece.capacity() > KEEP_BYTES {
            self.piece = Vec::new();
        }
        Ok(())
    }
}

/// Opens pieces and puts frame bodies back together.
pub struct Opener {
    keys: Arc<StatelessTransportState>,
    nonce: u64,
    /// The body of the frame being read.
    body: Vec<u8>,
    /// `body` holds a whole frame, already handed out.
    complete: bool,
}

impl Opener {
    /// Opens one piece (a Noise message, without its length): the whole
    /// frame body once this was its last piece.
    fn open(&mut self, piece: &[u8]) -> Result<Option<&[u8]>, ProtocolError> {
        if self.complete {
            self.complete = false;
            self.body.clear();
            if self.body.capacity() > KEEP_BYTES {
                self.body = Vec::new();
            }
        }
        if piece.len() < TAG_BYTES + 1 {
            return Err(ProtocolError::Rejected("a piece shorter than its tag"));
        }
        let start = self.body.len();
        let plain = piece.len() - TAG_BYTES;
        if start + plain - 1 > MAX_FRAME_BYTES {
            return Err(ProtocolError::TooLarge(start + plain - 1));
        }
        self.body.resize(start + plain, 0);
        if self
            .keys
            .read_message(self.nonce, piece, &mut self.body[start..])
            .is_err()
        {
            return Err(ProtocolError::Rejected(
                "it does not authenticate with this connection's keys \
                 (altered, replayed, reordered or from another connection)",
            ));
        }
        self.nonce += 1;
        match self.body.pop() {
            Some(LAST) => {
                self.complete = true;
                Ok(Some(&self.body))
            }
            Some(MORE) => Ok(None),
            // Sealed by a peer that holds the keys: a bug, not an attack.
            _ => Err(ProtocolError::Rejected(
                "a piece that ends in neither 0 nor 1",
            )),
        }
    }
}

/// The 2-byte length in front of every piece and handshake message.
pub(super) fn piece_len(head: [u8; 2]) -> usize {
    usize::from(u16::from_be_bytes(head))
}

/// Sends frames on a blocking stream (the worker's writer thread). Frames
/// are sealed into a buffer and written at [`BlockingWriter::flush`] (or
/// every 64 KiB), so a burst of reports costs one system call.
pub struct BlockingWriter<W: Write> {
    sealer: Sealer,
    output: W,
    buf: Vec<u8>,
}

impl<W: Write> BlockingWriter<W> {
    /// Queues one frame without flushing.
    pub fn put<M: Frame>(&mut self, msg: &M) -> Result<(), ProtocolError> {
        self.put_body(&encode(msg))
    }

    /// Queues one frame of an already [`encode`]d body; one over the frame
    /// limit is refused and nothing is queued.
    pub fn put_body(&mut self, body: &[u8]) -> Result<(), ProtocolError> {
        self.sealer.seal(body, &mut self.buf)?;
        if self.buf.len() >= WRITE_AT {
            self.write_out()?;
        }
        Ok(())
    }

    /// Writes everything queued.
    pub fn flush(&mut self) -> Result<(), ProtocolError> {
        self.write_out()?;
        self.output.flush()?;
        Ok(())
    }

    /// Writes one frame and flushes it.
    pub fn send<M: Frame>(&mut self, msg: &M) -> Result<(), ProtocolError> {
        self.put(msg)?;
        self.flush()
    }

    pub fn get_ref(&self) -> &W {
        &self.output
    }

    fn write_out(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.output.write_all(&self.buf)?;
        self.buf.clear();
        if self.buf.capacity() > KEEP_BYTES {
            self.buf = Vec::new();
        }
        Ok(())
    }
}

/// Reads frames from a blocking stream (the worker's reader thread).
pub struct BlockingReader<R: Read> {
    opener: Opener,
    input: R,
    piece: Vec<u8>,
}

impl<R: Read> BlockingReader<R> {
    /// The next message, of `M`'s conversation; [`ProtocolError::Closed`]
    /// at a clean end of stream.
    pub fn recv<M: Frame>(&mut self) -> Result<M, ProtocolError> {
        loop {
            let mut head = [0u8; 2];
            if let Err(e) = self.input.read_exact(&mut head) {
                return Err(if e.kind() == io::ErrorKind::UnexpectedEof {
                    ProtocolError::Closed
                } else {
                    e.into()
                });
            }
            self.piece.resize(piece_len(head), 0);
            self.input.read_exact(&mut self.piece)?;
            if let Some(body) = self.opener.open(&self.piece)? {
                return decode(body);
            }
        }
    }
}

impl Encoder<Bytes> for Sealer {
    type Error = ProtocolError;

    fn encode(&mut self, body: Bytes, dst: &mut BytesMut) -> Result<(), ProtocolError> {
        self.seal(&body, dst)
    }
}

/// Yields frame bodies; the reader decodes them as its conversation's.
impl Decoder for Opener {
    type Item = Bytes;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, ProtocolError> {
        loop {
            let Some(head) = src.get(..2) else {
                return Ok(None);
            };
            let end = 2 + piece_len([head[0], head[1]]);
            if src.len() < end {
                src.reserve(end - src.len());
                return Ok(None);
            }
            let frame = self.open(&src[2..end])?.map(Bytes::copy_from_slice);
            src.advance(end);
            if let Some(body) = frame {
                return Ok(Some(body));
            }
        }
    }
}

/// An async connection after its handshake (controller and agent side);
/// made by [`crate::auth::accept`] and [`crate::auth::connect`].
pub struct Connection {
    sink: FrameSink,
    stream: FrameStream,
}

impl Connection {
    pub(super) fn new(stream: TcpStream, keys: Keys) -> Self {
        let (sealer, opener) = keys.split();
        let (read, write) = stream.into_split();
        Self {
            sink: FrameSink(FramedWrite::new(write, sealer)),
            stream: FrameStream(FramedRead::new(read, opener)),
        }
    }

    pub async fn send<M: Frame>(&mut self, msg: &M) -> Result<(), ProtocolError> {
        self.sink.send(msg).await
    }

    /// Sends a body already [`encode`]d.
    pub async fn send_body(&mut self, body: Bytes) -> Result<(), ProtocolError> {
        self.sink.send_body(body).await
    }

    /// The next message, of `M`'s conversation; [`ProtocolError::Closed`]
    /// at a clean end of stream.
    pub async fn recv<M: Frame>(&mut self) -> Result<M, ProtocolError> {
        self.stream.recv().await
    }

    /// The next frame's body, undecoded: for a first message that says
    /// which conversation the connection is.
    pub async fn recv_body(&mut self) -> Result<Bytes, ProtocolError> {
        self.stream.recv_body().await
    }

    pub async fn recv_timeout<M: Frame>(&mut self, limit: Duration) -> Result<M, ProtocolError> {
        tokio::time::timeout(limit, self.recv())
            .await
            .map_err(|_| ProtocolError::Timeout(limit))?
    }

    /// Splits into independent halves so reading and writing can run in
    /// separate tasks.
    pub fn split(self) -> (FrameSink, FrameStream) {
        (self.sink, self.stream)
    }
}

pub struct FrameSink(FramedWrite<OwnedWriteHalf, Sealer>);
pub struct FrameStream(FramedRead<OwnedReadHalf, Opener>);

impl FrameSink {
    pub async fn send<M: Frame>(&mut self, msg: &M) -> Result<(), ProtocolError> {
        self.0.send(encode(msg)).await
    }

    /// Sends a body already [`encode`]d (by whoever knew its conversation).
    pub async fn send_body(&mut self, body: Bytes) -> Result<(), ProtocolError> {
        self.0.send(body).await
    }
}

impl FrameStream {
    /// The next message, of `M`'s conversation; [`ProtocolError::Closed`]
    /// at a clean end of stream.
    pub async fn recv<M: Frame>(&mut self) -> Result<M, ProtocolError> {
        decode_bytes(&self.recv_body().await?)
    }

    /// The next frame's body, undecoded.
    pub async fn recv_body(&mut self) -> Result<Bytes, ProtocolError> {
        self.0.next().await.unwrap_or(Err(ProtocolError::Closed))
    }
}

#[cfg(test)]
#[path = "channel_tests.rs"]
mod tests;
