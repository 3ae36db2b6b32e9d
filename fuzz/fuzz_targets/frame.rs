//! Any bytes a peer may send: as one frame body (`decode`, what the
//! controller and agent run on every frame), and as a stream of
//! length-prefixed frames (`read_frame`, the worker's side). Neither may
//! panic, hang or allocate past the frame limit, whatever the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshrun_core::protocol::frame::{decode, read_frame};

fuzz_target!(|data: &[u8]| {
    let _ = decode(data);
    let mut stream = data;
    while read_frame(&mut stream).is_ok() {}
});
