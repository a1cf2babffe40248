//! Fuzzes the server's request decoding (path, query, selectors, Accept, body, patches): any
//! input must come back as a value or an `ApiError`, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use simkube::fuzzing::{RawRequest, decode_request};

fuzz_target!(|data: &[u8]| {
    let req = RawRequest::from_bytes(data);
    if let Err(e) = decode_request(&req) {
        assert!(
            (400..600).contains(&e.code),
            "an error is an HTTP error: {e:?}"
        );
    }
});
