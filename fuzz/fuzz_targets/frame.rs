//! Any bytes a peer may send: as one frame body (`decode`, what the
//! controller, agent and worker run on every frame they open), and as the
//! stream that follows a handshake (`BlockingReader`, which reads the
//! pieces' lengths and opens them). Neither may panic, hang or allocate
//! past the frame limit, whatever the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshrun_protocol::auth::handshake_in_memory;
use meshrun_protocol::frame::decode;
use meshrun_protocol::token::Token;

fuzz_target!(|data: &[u8]| {
    let _ = decode(data);
    let token = Token::from_hex(&"07".repeat(32)).expect("64 hex characters");
    let (_, server) = handshake_in_memory(&token);
    let (mut reader, _) = server.into_blocking(data, std::io::sink());
    while reader.recv().is_ok() {}
});
