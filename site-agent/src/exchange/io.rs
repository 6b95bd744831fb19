//! Reading and writing whole exchange messages on a QUIC stream.

use longhaul_exchange::wire::{self, FIXED_LEN, Header, Kind, Message, WireError};
use quinn::{ReadExactError, RecvStream, SendStream};

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadMessageError {
    #[error("the stream ended")]
    Finished,
    #[error("{0}")]
    Read(#[from] quinn::ReadError),
    #[error("the stream ended inside a message")]
    Cut,
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("a message of {total} bytes where at most {limit} may come")]
    TooLong { total: usize, limit: usize },
}

/// The largest message with no data payload: a hello (a site id), a
/// welcome (8 bytes), an ack (none) or a refusal (a reason). What a peer
/// sends before it is known is held to this, not to a data message's 32 MiB.
pub(crate) const MAX_CONTROL_MESSAGE_BYTES: usize =
    FIXED_LEN + wire::MAX_JOB_BYTES + 4 + wire::MAX_REASON_BYTES;

/// Reads one message of at most `limit` bytes (itself at most
/// [`wire::MAX_MESSAGE_BYTES`]) into `buffer` and decodes it: the length is
/// checked from the fixed header before anything is allocated for the rest.
pub(crate) async fn read_message<'b>(
    recv: &mut RecvStream,
    buffer: &'b mut Vec<u8>,
    limit: usize,
) -> Result<Message<'b>, ReadMessageError> {
    buffer.clear();
    buffer.resize(FIXED_LEN, 0);
    match recv.read_exact(&mut buffer[..]).await {
        Ok(()) => {}
        Err(ReadExactError::FinishedEarly(0)) => return Err(ReadMessageError::Finished),
        Err(ReadExactError::FinishedEarly(_)) => return Err(ReadMessageError::Cut),
        Err(ReadExactError::ReadError(error)) => return Err(error.into()),
    }
    let total = wire::message_length(buffer)?;
    if total > limit {
        return Err(ReadMessageError::TooLong { total, limit });
    }
    buffer.resize(total, 0);
    match recv.read_exact(&mut buffer[FIXED_LEN..]).await {
        Ok(()) => {}
        Err(ReadExactError::FinishedEarly(_)) => return Err(ReadMessageError::Cut),
        Err(ReadExactError::ReadError(error)) => return Err(error.into()),
    }
    Ok(wire::decode(buffer)?)
}

/// Writes a message with no chunk (hello, welcome) or naming one (ack,
/// refused).
pub(crate) async fn write_message(
    send: &mut SendStream,
    header: &Header,
    payload: &[u8],
) -> Result<(), String> {
    let bytes = wire::encode_to_vec(header, payload).map_err(|error| error.to_string())?;
    send.write_all(&bytes)
        .await
        .map_err(|error| format!("write {}: {error}", header.kind.name()))
}

/// Whether the message is of `kind`, else a protocol error naming both.
pub(crate) fn expect(message: &Message<'_>, kind: Kind) -> Result<(), String> {
    if message.header.kind == kind {
        Ok(())
    } else {
        Err(format!(
            "expected a {} message, received a {}",
            kind.name(),
            message.header.kind.name()
        ))
    }
}
