//! The run's secret. It is the pre-shared key of every control connection
//! (see `meshrun_channel::auth`): only a peer that holds it completes the
//! handshake, and the token itself never crosses the network.

use std::fmt;

/// Where the run token is given to `meshrun run`, `meshrun join` and the
/// agents; never to a worker.
pub const TOKEN_ENV: &str = "MESHRUN_TOKEN";

/// 32 random bytes, carried as 64 hex characters in `MESHRUN_TOKEN`.
#[derive(Clone, PartialEq, Eq)]
pub struct Token([u8; 32]);

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the run token must be 64 hex characters (got {0} characters)")]
    BadLength(usize),
    #[error("the run token is not hex: {0}")]
    NotHex(#[from] hex::FromHexError),
    #[error("cannot draw random bytes for the run token: {0}")]
    Random(getrandom::Error),
}

impl Token {
    pub fn generate() -> Result<Self, TokenError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(TokenError::Random)?;
        Ok(Self(bytes))
    }

    pub fn from_hex(text: &str) -> Result<Self, TokenError> {
        let text = text.trim();
        if text.len() != 64 {
            return Err(TokenError::BadLength(text.len()));
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes)?;
        Ok(Self(bytes))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The token as the 32-byte pre-shared key of the Noise handshake.
    pub fn as_key(&self) -> &[u8; 32] {
        &self.0
    }
}

/// Who a control connection speaks for. The client says it in the clear
/// before the handshake, and it is bound into the handshake: a claim
/// changed on the way fails it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A holder of the run token: an agent, `meshrun stop`, `status`,
    /// `profile`, another host's agent bringing a replica.
    Run,
    /// One worker, by the credential of its rank in its attempt.
    Worker { attempt: u32, rank: u32 },
}

impl Peer {
    /// The claim's bytes on the wire: a role byte, the attempt and the rank.
    pub fn to_bytes(self) -> [u8; 9] {
        let mut out = [0u8; 9];
        if let Peer::Worker { attempt, rank } = self {
            out[0] = 1;
            out[1..5].copy_from_slice(&attempt.to_be_bytes());
            out[5..9].copy_from_slice(&rank.to_be_bytes());
        }
        out
    }

    pub fn from_bytes(bytes: [u8; 9]) -> Option<Self> {
        let word = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        match bytes[0] {
            0 if bytes[1..].iter().all(|b| *b == 0) => Some(Peer::Run),
            1 => Some(Peer::Worker {
                attempt: word(1),
                rank: word(5),
            }),
            _ => None,
        }
    }

    /// The key that proves this claim: the run token, or the worker's
    /// credential derived from it.
    pub fn key(self, token: &Token) -> Token {
        match self {
            Peer::Run => token.clone(),
            Peer::Worker { attempt, rank } => worker_key(token, attempt, rank),
        }
    }
}

/// The credential of rank `rank` in attempt `attempt`: a BLAKE2s MAC of
/// both under the run token. A worker holds this, never the token: it
/// proves that worker and nothing else (the controller takes only that
/// rank's hello of that attempt on it), so a program that hands its
/// environment to a tracker or a crash reporter gives away no way to join
/// as a host, stop the run, or speak as another rank or attempt.
pub fn worker_key(token: &Token, attempt: u32, rank: u32) -> Token {
    use blake2::digest::{FixedOutput, KeyInit, Update};
    let mut mac =
        blake2::Blake2sMac256::new_from_slice(token.as_key()).expect("a 32-byte key fits BLAKE2s");
    mac.update(b"meshrun worker credential");
    mac.update(&attempt.to_be_bytes());
    mac.update(&rank.to_be_bytes());
    Token(mac.finalize_fixed().into())
}

/// Never print the secret, even in debug output.
impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_redacts() {
        let t = Token::generate().unwrap();
        assert_eq!(Token::from_hex(&t.to_hex()).unwrap(), t);
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
        assert!(Token::from_hex("abc").is_err());
    }

    #[test]
    fn each_worker_has_its_own_credential_and_claims_round_trip() {
        let t = Token::generate().unwrap();
        let a = worker_key(&t, 1, 0);
        assert_eq!(a, worker_key(&t, 1, 0), "derived, not drawn");
        assert_ne!(a, t);
        assert_ne!(a, worker_key(&t, 1, 1), "another rank");
        assert_ne!(a, worker_key(&t, 2, 0), "another attempt");
        assert_ne!(
            a,
            worker_key(&Token::generate().unwrap(), 1, 0),
            "another run"
        );
        for peer in [
            Peer::Run,
            Peer::Worker {
                attempt: 3,
                rank: 70_000,
            },
        ] {
            assert_eq!(Peer::from_bytes(peer.to_bytes()), Some(peer));
        }
        assert_eq!(Peer::from_bytes([2, 0, 0, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(Peer::from_bytes([0, 0, 0, 0, 1, 0, 0, 0, 0]), None);
    }
}
