//! What the controller sends: a message of the conversation of the
//! connection it goes on. The driver encodes it as that conversation's.

use bytes::Bytes;
use meshrun_protocol::frame::encode;
use meshrun_protocol::{ClientReply, ToAgent, ToWorker};

#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    Agent(ToAgent),
    Worker(ToWorker),
    Client(ClientReply),
}

impl Outgoing {
    /// The frame body it is on the wire.
    pub fn encode(&self) -> Bytes {
        match self {
            Outgoing::Agent(m) => encode(m),
            Outgoing::Worker(m) => encode(m),
            Outgoing::Client(m) => encode(m),
        }
    }
}

impl From<ToAgent> for Outgoing {
    fn from(m: ToAgent) -> Self {
        Outgoing::Agent(m)
    }
}

impl From<ToWorker> for Outgoing {
    fn from(m: ToWorker) -> Self {
        Outgoing::Worker(m)
    }
}

impl From<ClientReply> for Outgoing {
    fn from(m: ClientReply) -> Self {
        Outgoing::Client(m)
    }
}

/// One conversation's messages among what was sent (the tests read what
/// went to a connection as its conversation's).
pub trait Sent {
    fn of(o: &Outgoing) -> Option<&Self>;
}

impl Sent for ToAgent {
    fn of(o: &Outgoing) -> Option<&Self> {
        match o {
            Outgoing::Agent(m) => Some(m),
            _ => None,
        }
    }
}

impl Sent for ToWorker {
    fn of(o: &Outgoing) -> Option<&Self> {
        match o {
            Outgoing::Worker(m) => Some(m),
            _ => None,
        }
    }
}

impl Sent for ClientReply {
    fn of(o: &Outgoing) -> Option<&Self> {
        match o {
            Outgoing::Client(m) => Some(m),
            _ => None,
        }
    }
}
