//! Any bytes a peer may send: as one frame body of every message kind
//! (`decode`, what the controller, agents, workers and replica peers run on
//! every frame they open), and as the stream that follows a handshake
//! (`BlockingReader`, the worker's side, which reads the pieces' lengths and
//! opens them). Neither may panic, hang or allocate past the frame limit,
//! whatever the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshrun_channel::auth::handshake_in_memory;
use meshrun_protocol::frame::decode;
use meshrun_protocol::token::Token;
use meshrun_protocol::{ClientReply, ClientRequest, FromAgent, FromWorker, ReplicaReply, ReplicaRequest, ToAgent, ToWorker};

fuzz_target!(|data: &[u8]| {
    let _ = decode::<FromAgent>(data);
    let _ = decode::<ToAgent>(data);
    let _ = decode::<FromWorker>(data);
    let _ = decode::<ToWorker>(data);
    let _ = decode::<ClientRequest>(data);
    let _ = decode::<ClientReply>(data);
    let _ = decode::<ReplicaRequest>(data);
    let _ = decode::<ReplicaReply>(data);
    let token = Token::from_hex(&"07".repeat(32)).expect("64 hex characters");
    let (_, server) = handshake_in_memory(&token);
    let (mut reader, _) = server.into_blocking(data, std::io::sink());
    while reader.recv::<ToWorker>().is_ok() {}
});
