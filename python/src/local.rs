//! Local memory as Python passes it: an integer address (Mooncake's way),
//! any object exposing the buffer protocol (`bytearray`, `memoryview`,
//! `numpy` arrays, `mmap`, ...), or an object with `data_ptr()` such as a
//! `torch.Tensor` on the CPU.
//!
//! A [`Local`] keeps the object (and its buffer export) alive, so memory a
//! transfer uses cannot be freed or resized while the GIL is released; a
//! batch holds its `Local`s until the engine has ended it. `ctypes`
//! arrays, whose exports lack strides, are taken through a `memoryview`.
//!
//! Memory to register ([`Local::extract_pinned`]) must stay put for as
//! long as peers may reach it. A buffer export does that (a `bytearray` or
//! `numpy` array cannot be resized while exported). A tensor's memory
//! belongs to its storage, which `resize_` moves to new memory, freeing
//! the old, whoever holds a reference: only a tensor whose storage cannot
//! be resized is registered, and the storage is kept, so it survives the
//! tensor being pointed elsewhere (`set_`) or dropped.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyNotImplementedError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyMemoryView};

/// Memory the caller passed for one side of a transfer.
pub enum Local {
    /// A raw address; its size is whatever the caller says.
    Addr(u64),
    /// A buffer-protocol export, released on drop.
    Buffer(PyUntypedBuffer),
    /// An object with `data_ptr()`, kept alive by this reference, and for
    /// registered memory the storage holding its bytes.
    DataPtr {
        _owner: Py<PyAny>,
        _storage: Option<Py<PyAny>>,
        addr: u64,
        len: u64,
    },
}

/// `obj` as an integer address, if it is one: a Python `int`, or an object
/// whose `__index__` gives one and that is no array of several elements
/// (numpy integer scalars, 0-d integer arrays), as Mooncake's binding
/// reads addresses. Checked before the buffer protocol, since a numpy
/// scalar also exports its own eight bytes as a buffer.
fn as_integer<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    if obj.is_instance_of::<PyInt>() {
        return Some(obj.clone());
    }
    let scalar = match obj.getattr("ndim") {
        Ok(ndim) => ndim.extract::<u64>().is_ok_and(|n| n == 0),
        Err(_) => true,
    };
    if !scalar {
        return None;
    }
    obj.call_method0("__index__")
        .ok()
        .filter(|i| i.is_instance_of::<PyInt>())
}

/// Whether the memory will be written (a READ lands in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Only read from (the source of a WRITE).
    Read,
    /// Written to (the destination of a READ).
    Write,
}

impl Local {
    /// Interprets `obj` as local memory.
    pub fn extract(obj: &Bound<'_, PyAny>, access: Access) -> PyResult<Local> {
        Self::extract_with(obj, access, false)
    }

    /// Interprets `obj` as writable memory to register, which must not move
    /// while registered: a tensor (an object with `untyped_storage()`) is
    /// refused unless its storage cannot be resized, and its storage is
    /// kept with it.
    pub fn extract_pinned(obj: &Bound<'_, PyAny>) -> PyResult<Local> {
        Self::extract_with(obj, Access::Write, true)
    }

    fn extract_with(obj: &Bound<'_, PyAny>, access: Access, pin: bool) -> PyResult<Local> {
        if let Some(int) = as_integer(obj) {
            return int.extract::<u64>().map(Local::Addr).map_err(|_| {
                PyValueError::new_err("an address must be a non-negative integer below 2**64")
            });
        }
        // Some exporters (ctypes arrays) leave out strides, which PyO3
        // requires; a memoryview of them fills them in.
        let buffer = PyUntypedBuffer::get(obj).or_else(|e| {
            PyMemoryView::from(obj)
                .and_then(|view| PyUntypedBuffer::get(view.as_any()))
                .map_err(|_| e)
        });
        if let Ok(buf) = buffer {
            if !buf.is_c_contiguous() {
                return Err(PyValueError::new_err(
                    "the buffer is not C-contiguous; pass a contiguous copy",
                ));
            }
            if access == Access::Write && buf.readonly() {
                return Err(PyTypeError::new_err(
                    "the buffer is read-only; a READ needs writable memory (e.g. a bytearray)",
                ));
            }
            return Ok(Local::Buffer(buf));
        }
        if obj.hasattr("data_ptr")? {
            return data_ptr_object(obj, pin);
        }
        let why = buffer.err().map(|e| e.to_string()).unwrap_or_default();
        Err(PyTypeError::new_err(format!(
            "expected an integer address, an object supporting the buffer protocol, or a \
             tensor with data_ptr(); got {} ({why})",
            obj.get_type().name()?
        )))
    }

    /// The address of byte 0.
    pub fn addr(&self) -> u64 {
        match self {
            Local::Addr(a) => *a,
            Local::Buffer(b) => b.buf_ptr() as u64,
            Local::DataPtr { addr, .. } => *addr,
        }
    }

    /// The size in bytes, unless it is a bare address.
    pub fn size(&self) -> Option<u64> {
        match self {
            Local::Addr(_) => None,
            Local::Buffer(b) => Some(b.len_bytes() as u64),
            Local::DataPtr { len, .. } => Some(*len),
        }
    }

    /// The number of bytes to move: `length` when given (it must fit in the
    /// object), else the object's whole size.
    pub fn span(&self, length: Option<u64>) -> PyResult<u64> {
        match (length, self.size()) {
            (Some(n), Some(size)) if n > size => Err(PyValueError::new_err(format!(
                "length {n} exceeds the {size} bytes of the buffer"
            ))),
            (Some(n), _) => Ok(n),
            (None, Some(size)) => Ok(size),
            (None, None) => Err(PyValueError::new_err(
                "length is required when the buffer is given as an integer address",
            )),
        }
    }
}

/// Releases `objects` (their buffer exports and references) with the GIL
/// held. When the interpreter is finalizing and the GIL cannot be taken,
/// PyO3 leaks them instead.
pub fn release(objects: Vec<Local>) {
    if !objects.is_empty() {
        let _ = Python::try_attach(move |_| drop(objects));
    }
}

/// A tensor-like object: `data_ptr()` and `nbytes` (or `numel()` times
/// `element_size()`), contiguous, in host memory. With `pin`, its storage
/// is checked and kept ([`storage_of`]).
fn data_ptr_object(obj: &Bound<'_, PyAny>, pin: bool) -> PyResult<Local> {
    if obj
        .getattr("is_cuda")
        .and_then(|v| v.is_truthy())
        .unwrap_or(false)
    {
        return Err(PyNotImplementedError::new_err(
            "CUDA tensors need a CUDA build of the transfer engine (SUPPORT_CUDA is False); \
             pass host memory",
        ));
    }
    if obj.hasattr("is_contiguous")? && !obj.call_method0("is_contiguous")?.is_truthy()? {
        return Err(PyValueError::new_err(
            "the tensor is not contiguous; pass tensor.contiguous()",
        ));
    }
    let addr: u64 = obj.call_method0("data_ptr")?.extract()?;
    let len: u64 = match obj.getattr("nbytes") {
        Ok(n) => n.extract()?,
        Err(_) => {
            let numel: u64 = obj.call_method0("numel")?.extract()?;
            let elem: u64 = obj.call_method0("element_size")?.extract()?;
            numel.checked_mul(elem).ok_or_else(|| {
                PyValueError::new_err("the tensor's size in bytes overflows 64 bits")
            })?
        }
    };
    let storage = if pin {
        storage_of(obj, addr, len)?
    } else {
        None
    };
    Ok(Local::DataPtr {
        _owner: obj.clone().unbind(),
        _storage: storage,
        addr,
        len,
    })
}

/// The storage of a tensor to register (`untyped_storage()`, as torch has
/// it; `None` for an object without one): it must not be resizable and
/// must hold the `len` bytes at `addr`.
fn storage_of(obj: &Bound<'_, PyAny>, addr: u64, len: u64) -> PyResult<Option<Py<PyAny>>> {
    if !obj.hasattr("untyped_storage")? {
        return Ok(None);
    }
    let storage = obj.call_method0("untyped_storage")?;
    if storage.call_method0("resizable")?.is_truthy()? {
        return Err(PyValueError::new_err(
            "the tensor's storage is resizable: resize_() would move its bytes and free the \
             registered memory under the engine. Register a tensor whose storage cannot be \
             resized (torch.from_numpy(array), torch.frombuffer(buffer), or after \
             t.share_memory_()), or register_memory(t.data_ptr(), t.nbytes) and never resize it",
        ));
    }
    let base: u64 = storage.call_method0("data_ptr")?.extract()?;
    let size: u64 = storage.call_method0("nbytes")?.extract()?;
    let inside = addr >= base
        && addr
            .checked_add(len)
            .is_some_and(|end| end <= base.saturating_add(size));
    if !inside {
        return Err(PyValueError::new_err(format!(
            "the tensor's {len} bytes at {addr:#x} are not inside its storage ({size} bytes at \
             {base:#x})"
        )));
    }
    Ok(Some(storage.unbind()))
}
