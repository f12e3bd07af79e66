//! Logits that a user's Python step could move: checked after each such step, before anything
//! more is written to them.
//!
//! A DLPack import does not keep the memory it describes alive: torch's `resize_` reallocates a
//! storage, and numpy's `resize(refcheck=False)` an array's data, while a capsule of theirs is
//! alive (both tried). So the owner of the memory is held for the whole step and checked instead:
//! torch's storage object (held, it outlives a `set_` of the tensor; its data pointer changes
//! when the storage itself is reallocated), or the numpy array that owns the data (its data
//! pointer changes when it is resized). While the owner still has the memory that was imported,
//! writing to it (to restore it) is safe; otherwise nothing may be written to it again.

use dlpark::ffi::DLDataType;
use pyo3::intern;
use pyo3::prelude::*;

use crate::errors::{new_err, ErrorClass};
use crate::tensor::TensorView;

/// Who owns a tensor's memory, and which memory it had when the step began.
enum Owner {
    /// torch: the tensor's `untyped_storage()`.
    Torch { storage: Py<PyAny>, memory: Memory },
    /// numpy: the array at the end of the `.base` chain, owning its data.
    Numpy { root: Py<PyAny>, memory: Memory },
    /// Anything else (another DLPack producer, an array over a foreign buffer): only the object's
    /// own metadata can be compared.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Memory {
    ptr: usize,
    nbytes: usize,
}

/// What a tensor looked like through DLPack.
#[derive(Debug, Clone, PartialEq)]
struct Layout {
    data: usize,
    dtype: DLDataType,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

impl Layout {
    fn of(view: &TensorView) -> Self {
        Self {
            data: view.data as usize,
            dtype: view.dtype,
            shape: view.shape.clone(),
            strides: view.strides.clone(),
        }
    }
}

/// A step that moved the logits.
#[derive(Debug)]
pub(crate) struct Moved {
    /// What happened, for the error message.
    pub what: String,
    /// Whether the memory imported when the step began is still alive (held by its owner), so
    /// that restoring it is safe.
    pub memory_alive: bool,
}

/// One logits object (`name` is how messages call it), as imported when a step began.
pub(crate) struct Watched {
    name: &'static str,
    object: Py<PyAny>,
    layout: Layout,
    owner: Owner,
}

impl Watched {
    /// Starts watching `object`, whose DLPack view is `view`.
    pub fn new(name: &'static str, object: &Bound<'_, PyAny>, view: &TensorView) -> Self {
        Self {
            name,
            object: object.clone().unbind(),
            layout: Layout::of(view),
            // An owner that cannot be found leaves only the object's metadata to compare.
            owner: owner_of(object).unwrap_or(Owner::Unknown),
        }
    }

    /// How the object moved since the step began, if it did.
    pub fn check(&self, py: Python<'_>) -> Option<Moved> {
        let alive = match &self.owner {
            Owner::Torch { storage, memory } => {
                Some(torch_memory(storage.bind(py)).ok() == Some(*memory))
            }
            Owner::Numpy { root, memory } => {
                Some(numpy_memory(root.bind(py)).ok() == Some(*memory))
            }
            Owner::Unknown => None,
        };
        let name = self.name;
        if alive == Some(false) {
            return Some(Moved {
                what: format!("the memory of {name} was reallocated (resize_ or resize)"),
                memory_alive: false,
            });
        }
        // Without a known owner, memory that the object no longer points to may be gone.
        let memory_alive = alive.unwrap_or(false);
        match TensorView::of(self.object.bind(py)) {
            Ok(view) if Layout::of(&view) == self.layout => None,
            Ok(_) => Some(Moved {
                what: format!("{name} were pointed at other memory or reshaped (set_ or resize_)"),
                memory_alive,
            }),
            Err(error) => Some(Moved {
                what: format!("{name} could not be read back ({error})"),
                memory_alive,
            }),
        }
    }
}

/// Unless `object` still has the layout `view` had, the error for logits (`name`) that Python code
/// run while the input ids were read (an iterator, `__index__`, `__dlpack__`) moved: nothing was
/// written to them, and the caller takes the step back.
pub(crate) fn check_unmoved(
    name: &str,
    object: &Bound<'_, PyAny>,
    view: &TensorView,
) -> PyResult<()> {
    match TensorView::of(object) {
        Ok(now) if Layout::of(&now) == Layout::of(view) => Ok(()),
        _ => Err(new_err(
            ErrorClass::Shape,
            format!(
                "{name} were moved or reshaped while input_ids were read (reading them ran \
                 Python code); nothing was edited"
            ),
        )),
    }
}

/// Whether the row view `row` a user's step was given still describes the `vocab` elements at
/// `data`: a step that points its row elsewhere (`row.set_(...)`) would have its edits lost.
pub(crate) fn row_moved(row: &Bound<'_, PyAny>, data: usize, vocab: usize) -> Option<Moved> {
    let moved = |what: String| {
        Some(Moved {
            what,
            memory_alive: true,
        })
    };
    match TensorView::of(row) {
        Ok(view) => {
            let contiguous = vocab <= 1 || view.strides == [1];
            if view.data as usize == data && view.shape == [vocab as i64] && contiguous {
                None
            } else {
                moved("its row was pointed at other memory or reshaped (set_ or resize_), so its edits would be lost".into())
            }
        }
        Err(error) => moved(format!("its row could not be read back ({error})")),
    }
}

fn owner_of(object: &Bound<'_, PyAny>) -> PyResult<Owner> {
    let py = object.py();
    if let Ok(storage) = object.getattr(intern!(py, "untyped_storage")) {
        let storage = storage.call0()?;
        let memory = torch_memory(&storage)?;
        return Ok(Owner::Torch {
            storage: storage.unbind(),
            memory,
        });
    }
    let interface = intern!(py, "__array_interface__");
    if object.hasattr(interface)? {
        let mut root = object.clone();
        loop {
            match root.getattr(intern!(py, "base")) {
                Ok(base) if !base.is_none() && base.hasattr(interface)? => root = base,
                _ => break,
            }
        }
        let owns = root
            .getattr(intern!(py, "flags"))?
            .getattr(intern!(py, "owndata"))?
            .is_truthy()?;
        if owns {
            let memory = numpy_memory(&root)?;
            return Ok(Owner::Numpy {
                root: root.unbind(),
                memory,
            });
        }
    }
    Ok(Owner::Unknown)
}

fn torch_memory(storage: &Bound<'_, PyAny>) -> PyResult<Memory> {
    let py = storage.py();
    Ok(Memory {
        ptr: storage.call_method0(intern!(py, "data_ptr"))?.extract()?,
        nbytes: storage.call_method0(intern!(py, "nbytes"))?.extract()?,
    })
}

fn numpy_memory(array: &Bound<'_, PyAny>) -> PyResult<Memory> {
    let py = array.py();
    let data = array
        .getattr(intern!(py, "__array_interface__"))?
        .get_item(intern!(py, "data"))?
        .get_item(0)?;
    Ok(Memory {
        ptr: data.extract()?,
        nbytes: array.getattr(intern!(py, "nbytes"))?.extract()?,
    })
}
