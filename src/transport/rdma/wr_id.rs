//! The work request id: how a completion finds its endpoint and queue pair
//! from the `wr_id` the request was posted with. Below both the endpoint
//! (which encodes it when it posts) and the pool's slab (which hands out
//! the endpoint tags it carries and finds an endpoint from it).

/// Where a work request's completion finds its endpoint and queue pair:
/// packed into the request's `wr_id` (from the low bits up: 24 bits of the
/// queue pair's request sequence, 8 bits of the queue pair's slot in the
/// endpoint, 20 bits of the endpoint's index in its device's endpoint
/// slab and 12 bits of the generation of that index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrId {
    /// The endpoint's tag (given by the device's endpoint slab): index and
    /// generation.
    pub tag: u64,
    /// The queue pair's slot in the endpoint.
    pub slot: usize,
    /// The low [`WrId::SEQ_BITS`] bits of the request's sequence number.
    pub seq: u32,
}

impl WrId {
    /// Bits of the request sequence number carried.
    pub const SEQ_BITS: u32 = 24;
    /// Mask of those bits.
    pub const SEQ_MASK: u64 = (1 << Self::SEQ_BITS) - 1;
    const SLOT_SHIFT: u32 = Self::SEQ_BITS;
    const INDEX_SHIFT: u32 = 32;
    const INDEX_BITS: u32 = 20;
    const GEN_SHIFT: u32 = Self::INDEX_SHIFT + Self::INDEX_BITS;
    /// Mask of the generation of a slab index.
    pub(super) const GEN_MASK: u32 = (1 << (64 - Self::GEN_SHIFT)) - 1;

    /// The tag of slab index `index` in generation `gen`.
    pub(super) fn tag(index: u32, generation: u32) -> u64 {
        (u64::from(generation & Self::GEN_MASK) << Self::GEN_SHIFT)
            | (u64::from(index) << Self::INDEX_SHIFT)
    }

    /// The `wr_id` of request `seq` on slot `slot` of the endpoint tagged
    /// `tag` (slots beyond 255 do not exist: `MC_NUM_QP_PER_EP` <= 255).
    pub fn encode(tag: u64, slot: usize, seq: u64) -> u64 {
        tag | ((slot as u64 & 0xff) << Self::SLOT_SHIFT) | (seq & Self::SEQ_MASK)
    }

    /// The parts of a `wr_id`.
    pub fn decode(wr_id: u64) -> WrId {
        WrId {
            tag: wr_id & !((1u64 << Self::INDEX_SHIFT) - 1),
            slot: ((wr_id >> Self::SLOT_SHIFT) & 0xff) as usize,
            seq: (wr_id & Self::SEQ_MASK) as u32,
        }
    }

    /// The endpoint's index in its device's slab.
    pub(super) fn index(self) -> usize {
        ((self.tag >> Self::INDEX_SHIFT) & ((1 << Self::INDEX_BITS) - 1)) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_ids_round_trip() {
        let tag = WrId::tag(0xfffff, 0xabc);
        let id = WrId::decode(WrId::encode(tag, 7, (5 << 24) | 0x123456));
        assert_eq!(
            id,
            WrId {
                tag,
                slot: 7,
                seq: 0x123456
            }
        );
        assert_eq!(id.index(), 0xfffff);
        assert_eq!(WrId::decode(WrId::encode(WrId::tag(3, 1), 0, 9)).index(), 3);
    }
}
