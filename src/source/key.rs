//! Inbox keys for ids that are not UUIDs, and for records that carry no id: version-8 UUIDs
//! from SHA-256, so that the same id on the same topic always gives the same key.
//!
//! The hashed bytes, in order (docs/SQL-HANDLER.md gives the same table):
//!
//! | bytes | what |
//! |---|---|
//! | 16 | [`NAMESPACE`], the UUID `19d0d0d2-5fa2-4729-8c82-c0a580d4ae9d` |
//! | 1 | the kind: `0x01` an id value, `0x02` a position in the log |
//! | 4 | the topic name's length in bytes, big-endian |
//! | n | the topic name |
//! | 4 + m | an id: its length in bytes, big-endian, then the id bytes as received |
//! | 4 + 8 | a position: the partition (i32) and the offset (i64), big-endian |
//!
//! The key is the digest's first 16 bytes with the version nibble set to 8 and the variant bits
//! to RFC 9562's (`10`). Lengths come first so that no two inputs share their bytes (topic `ab`
//! with id `c` against topic `a` with id `bc`), and the kind keeps a position apart from an id.
//! Two different inputs share a key only with the probability of a 122-bit hash collision.

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The namespace hashed in front of every derived key.
pub const NAMESPACE: Uuid = Uuid::from_u128(0x19d0d0d2_5fa2_4729_8c82_c0a580d4ae9d);

const ID: u8 = 0x01;
const POSITION: u8 = 0x02;

/// The key of id `id` (any bytes) on `topic`.
pub fn id_key(topic: &str, id: &[u8]) -> Uuid {
    let mut h = start(ID, topic);
    h.update(length(id.len()));
    h.update(id);
    finish(h)
}

/// The key of the record at `offset` of `partition` of `topic`.
pub fn position_key(topic: &str, partition: i32, offset: i64) -> Uuid {
    let mut h = start(POSITION, topic);
    h.update(partition.to_be_bytes());
    h.update(offset.to_be_bytes());
    finish(h)
}

fn start(kind: u8, topic: &str) -> Sha256 {
    let mut h = Sha256::new();
    h.update(NAMESPACE.as_bytes());
    h.update([kind]);
    h.update(length(topic.len()));
    h.update(topic.as_bytes());
    h
}

/// A length as 4 big-endian bytes. Ids are bounded far below 4 GiB before they get here; a
/// longer input would saturate, never wrap.
fn length(n: usize) -> [u8; 4] {
    u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes()
}

fn finish(h: Sha256) -> Uuid {
    let digest = h.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    Uuid::new_v8(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented bytes, hashed by hand: the same layout computed independently
    /// (`python3 -c "import hashlib; …"`, see docs/SQL-HANDLER.md) gives these keys.
    #[test]
    fn keys_follow_the_documented_bytes() {
        assert_eq!(
            id_key("orders", b"order-42").to_string(),
            "e873a57c-b659-8eb9-8672-7435d331308c"
        );
        assert_eq!(
            position_key("orders", 3, 17).to_string(),
            "b464aaad-b379-80d9-a75c-fc1cd4730359"
        );
    }

    #[test]
    fn keys_are_version_8_and_keep_inputs_apart() {
        let k = id_key("t", b"42");
        assert_eq!(k.get_version_num(), 8);
        assert_eq!(k.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(k, id_key("t", b"42"), "deterministic");
        let others = [
            id_key("u", b"42"),
            id_key("t", b"43"),
            id_key("t", b"42 "),
            id_key("ab", b"c"),
            id_key("a", b"bc"),
            position_key("t", 0, 42),
            position_key("t", 1, 42),
            position_key("u", 0, 42),
        ];
        for (i, a) in others.iter().enumerate() {
            assert_ne!(*a, k);
            for b in &others[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_ne!(id_key("t", b"Order-1"), id_key("t", b"order-1"), "case");
    }
}
