//! Notification arrays handed to C: allocated with `malloc` so that C code
//! written for Mooncake may also release them itself with `free`.

use super::types::notify_msg_t;
use std::ffi::c_char;

/// Copies a string into a `malloc`ed NUL-terminated buffer.
fn malloc_string(s: &str) -> Option<*mut c_char> {
    // SAFETY: malloc of len + 1 bytes; NULL is checked.
    let p = unsafe { libc::malloc(s.len() + 1) }.cast::<u8>();
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` holds len + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), p, s.len());
        *p.add(s.len()) = 0;
    }
    Some(p.cast())
}

/// Builds the `malloc`ed array of `(name, msg)` pairs; `None` when memory
/// runs out (everything allocated so far is released).
pub fn to_c_array(items: &[(String, String)]) -> Option<*mut notify_msg_t> {
    let bytes = items.len().checked_mul(size_of::<notify_msg_t>())?;
    // SAFETY: calloc zeroes the array so a partial failure can be freed.
    let array = unsafe { libc::calloc(1, bytes) }.cast::<notify_msg_t>();
    if array.is_null() {
        return None;
    }
    for (i, (name, msg)) in items.iter().enumerate() {
        // SAFETY: i < items.len(), the array's length.
        let slot = unsafe { &mut *array.add(i) };
        match (malloc_string(name), malloc_string(msg)) {
            (Some(n), Some(m)) => *slot = notify_msg_t { name: n, msg: m },
            (n, m) => {
                // SAFETY: the strings came from malloc; the array holds
                // items.len() zero-initialised or filled entries.
                unsafe {
                    n.into_iter().chain(m).for_each(|p| libc::free(p.cast()));
                    free_c_array(array, items.len());
                }
                return None;
            }
        }
    }
    Some(array)
}

/// Releases an array built by [`to_c_array`].
///
/// # Safety
/// `array` must be NULL or come from [`to_c_array`] with `len` entries, and
/// must not be used afterwards.
pub unsafe fn free_c_array(array: *mut notify_msg_t, len: usize) {
    if array.is_null() {
        return;
    }
    for i in 0..len {
        // SAFETY: i < len; the strings are NULL or malloc'ed.
        unsafe {
            let slot = &*array.add(i);
            libc::free(slot.name.cast());
            libc::free(slot.msg.cast());
        }
    }
    // SAFETY: the array came from calloc.
    unsafe { libc::free(array.cast()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn round_trip() {
        let items = vec![
            ("a".to_string(), "hello".to_string()),
            (String::new(), "x".into()),
        ];
        let array = to_c_array(&items).unwrap();
        // SAFETY: two entries just built.
        unsafe {
            assert_eq!(CStr::from_ptr((*array).msg).to_str().unwrap(), "hello");
            assert_eq!(CStr::from_ptr((*array.add(1)).name).to_str().unwrap(), "");
            free_c_array(array, 2);
        }
    }
}
