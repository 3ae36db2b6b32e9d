//! The run's secret. It is the pre-shared key of every control connection
//! (see `protocol::auth`): only a peer that holds it completes the
//! handshake, and the token itself never crosses the network.

use std::fmt;

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
}
