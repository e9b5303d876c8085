//! NVML's opaque handles as the mock hands them out: tagged integers, never real pointers.
//!
//! A handle the mock did not issue decodes to `None`, and callers answer it the way NVML documents
//! for an invalid handle (`NVML_ERROR_INVALID_ARGUMENT`).

/// Top 32 bits of every handle ("mock").
const MAGIC: u64 = 0x6d6f_636b;
const FIELD_BITS: u32 = 14;
const FIELD_MASK: u64 = (1 << FIELD_BITS) - 1;

/// What a handle stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handle {
    /// A physical GPU, by NVML index.
    Gpu(u32),
    /// A MIG device: its GPU's index and its position among that GPU's MIG devices.
    Mig {
        /// Index of the parent GPU.
        gpu: u32,
        /// Position among the parent's MIG devices.
        slot: u32,
    },
    /// A GPU instance, by parent GPU index and GPU-instance id.
    GpuInstance {
        /// Index of the parent GPU.
        gpu: u32,
        /// GPU-instance id.
        id: u32,
    },
    /// An event set, by its number.
    EventSet(u32),
    /// A compute instance, by parent GPU index, GPU-instance id and compute-instance id (each id
    /// below 128).
    ComputeInstance {
        /// Index of the parent GPU.
        gpu: u32,
        /// GPU-instance id.
        gi: u32,
        /// Compute-instance id.
        ci: u32,
    },
}

impl Handle {
    /// The integer a C caller holds for this handle.
    pub fn encode(self) -> usize {
        let (kind, a, b) = match self {
            Handle::Gpu(i) => (1, i, 0),
            Handle::Mig { gpu, slot } => (2, gpu, slot),
            Handle::GpuInstance { gpu, id } => (3, gpu, id),
            Handle::EventSet(n) => (4, n, 0),
            Handle::ComputeInstance { gpu, gi, ci } => (5, gpu, (gi & 0x7f) << 7 | (ci & 0x7f)),
        };
        let value = (MAGIC << 32)
            | (kind << (2 * FIELD_BITS))
            | ((u64::from(a) & FIELD_MASK) << FIELD_BITS)
            | (u64::from(b) & FIELD_MASK);
        value as usize
    }

    /// Reads an integer back; `None` for anything the mock did not issue.
    pub fn decode(value: usize) -> Option<Self> {
        let value = value as u64;
        if value >> 32 != MAGIC {
            return None;
        }
        let kind = (value >> (2 * FIELD_BITS)) & 0xf;
        let a = ((value >> FIELD_BITS) & FIELD_MASK) as u32;
        let b = (value & FIELD_MASK) as u32;
        match kind {
            1 if b == 0 => Some(Handle::Gpu(a)),
            2 => Some(Handle::Mig { gpu: a, slot: b }),
            3 => Some(Handle::GpuInstance { gpu: a, id: b }),
            4 if b == 0 => Some(Handle::EventSet(a)),
            5 => Some(Handle::ComputeInstance {
                gpu: a,
                gi: b >> 7,
                ci: b & 0x7f,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips() {
        for h in [
            Handle::Gpu(7),
            Handle::Mig { gpu: 3, slot: 2 },
            Handle::GpuInstance { gpu: 1, id: 13 },
            Handle::EventSet(42),
            Handle::ComputeInstance {
                gpu: 2,
                gi: 14,
                ci: 3,
            },
        ] {
            assert_eq!(Handle::decode(h.encode()), Some(h));
        }
    }

    #[test]
    fn foreign_values_are_not_handles() {
        assert_eq!(Handle::decode(0), None);
        assert_eq!(Handle::decode(0x7fff_dead_beef), None);
        assert_eq!(Handle::decode(Handle::Gpu(1).encode() | 0xf << 28), None);
    }
}
