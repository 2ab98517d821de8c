//! Heap buffers the tests hand to the transport, touched only through raw
//! pointers (a peer writes them from another process meanwhile).

/// `len` bytes of heap memory.
pub struct Buf {
    ptr: *mut u8,
    len: usize,
    // Owns the allocation; never accessed through the Vec after creation.
    _keep: Vec<u8>,
}

// SAFETY: plain bytes accessed through raw pointers; the tests synchronize
// with the writers through the transport's completions.
unsafe impl Send for Buf {}
// SAFETY: as above.
unsafe impl Sync for Buf {}

impl Buf {
    /// `len` bytes of the pattern of `seed`.
    pub fn new(len: usize, seed: u8) -> Buf {
        let mut v: Vec<u8> = (0..len).map(|i| pattern_byte(i, seed)).collect();
        let ptr = v.as_mut_ptr();
        Buf { ptr, len, _keep: v }
    }

    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Buf {
        let mut v = vec![0u8; len];
        let ptr = v.as_mut_ptr();
        Buf { ptr, len, _keep: v }
    }

    /// Address of byte 0.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// `n` bytes from `off`.
    pub fn get(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len);
        let mut out = vec![0u8; n];
        // SAFETY: in bounds (checked); the bytes may change meanwhile,
        // which a copy tolerates.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), n) };
        out
    }

    /// Every byte.
    pub fn snapshot(&self) -> Vec<u8> {
        self.get(0, self.len)
    }

    /// Writes `data` at `off`.
    pub fn set(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }
}

/// Byte `i` of the pattern of `seed`.
pub fn pattern_byte(i: usize, seed: u8) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8 ^ (i >> 16) as u8
}
