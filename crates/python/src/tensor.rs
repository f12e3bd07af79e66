//! Tensors from Python through DLPack: the logits block to edit in place, and integer token ids.
//!
//! torch tensors are read through the DLPack C Exchange API (`__dlpack_c_exchange_api__`): a
//! borrowed view, no capsule and no Python call, well under a microsecond. Anything else with
//! `__dlpack__` (numpy arrays, ...) goes through the standard protocol. Nothing is ever copied: a
//! layout or device we cannot edit in place is an error.

use std::ffi::c_void;

use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLTensor};
use dlpark::python::consumer::exchange::ExchangeApi;
use dlpark::python::{from_dlpack, ImportedDlpack};
use dlpark::DlpackFlags;
use logits_processing::{BatchLayout, DType};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use std::sync::Mutex;

use crate::errors::{new_err, ErrorClass};

/// Types known to lack the DLPack C Exchange API (numpy's ndarray, ...), so that looking it up
/// (a failed attribute lookup, which builds an exception) happens once per type, not per call.
/// The strong references keep each type, and so its address, alive.
static NO_EXCHANGE_API: Mutex<Vec<Py<PyType>>> = Mutex::new(Vec::new());

fn exchange_api(object: &Bound<'_, PyAny>) -> PyResult<Option<ExchangeApi>> {
    let ty = object.get_type();
    {
        let known = NO_EXCHANGE_API.lock().unwrap_or_else(|e| e.into_inner());
        if known.iter().any(|t| t.as_ptr() == ty.as_ptr()) {
            return Ok(None);
        }
    }
    let api = ExchangeApi::from_object(object.as_borrowed())?;
    if api.is_none() {
        let mut known = NO_EXCHANGE_API.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() < 64 {
            known.push(ty.unbind());
        }
    }
    Ok(api)
}

/// Where a tensor's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Device {
    Cpu,
    Cuda(i32),
    Other(DLDevice),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(id) => write!(f, "cuda:{id}"),
            Device::Other(d) => write!(f, "DLPack device type {}:{}", d.device_type.0, d.device_id),
        }
    }
}

fn device_of(device: DLDevice) -> Device {
    match device.device_type {
        // Pinned host memory is host memory.
        DLDeviceType::CPU | DLDeviceType::CUDAHOST => Device::Cpu,
        DLDeviceType::CUDA => Device::Cuda(device.device_id),
        _ => Device::Other(device),
    }
}

/// A tensor's metadata, copied out of its DLPack descriptor. `data` stays valid while the Python
/// object it came from is alive (and `_owner`, for the standard protocol, is not dropped).
pub(crate) struct TensorView {
    /// The first element (byte offset applied).
    pub data: *mut u8,
    pub dtype: DLDataType,
    pub shape: Vec<i64>,
    /// In elements, one per dimension.
    pub strides: Vec<i64>,
    pub device: Device,
    pub read_only: bool,
    /// The producer's current stream for `device` (torch's current CUDA stream), if it said.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub stream: Option<u64>,
    /// A torch tensor: an edit in place must bump its autograd version counter.
    pub torch: bool,
    // Releases the DLPack capsule of a standard-protocol import. Must be dropped with the GIL held.
    _owner: Option<ImportedDlpack>,
}

impl TensorView {
    fn from_dltensor(
        t: &DLTensor,
        stream: Option<*mut c_void>,
        owner: Option<ImportedDlpack>,
    ) -> Self {
        let ndim = t.ndim.max(0) as usize;
        // SAFETY: a valid DLTensor has `ndim` entries behind `shape` and (when not null) `strides`.
        let shape: Vec<i64> = if ndim == 0 || t.shape.is_null() {
            vec![]
        } else {
            unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec()
        };
        let strides = if ndim == 0 {
            vec![]
        } else if t.strides.is_null() {
            // Before DLPack 1.2, null strides meant row-major compact.
            let mut strides = vec![1i64; ndim];
            for i in (0..ndim.saturating_sub(1)).rev() {
                strides[i] = strides[i + 1] * shape[i + 1];
            }
            strides
        } else {
            unsafe { std::slice::from_raw_parts(t.strides, ndim) }.to_vec()
        };
        Self {
            torch: false,
            data: (t.data as *mut u8).wrapping_add(t.byte_offset as usize),
            dtype: t.dtype,
            shape,
            strides,
            device: device_of(t.device),
            read_only: false,
            stream: stream.filter(|s| !s.is_null()).map(|s| s as u64),
            _owner: owner,
        }
    }

    /// Reads `object` (the logits)'s DLPack descriptor without copying its data.
    pub fn of(object: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::of_named(object, "logits")
    }

    /// [`TensorView::of`] for the argument `name`, which its errors name.
    pub fn of_named(object: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        let py = object.py();
        let borrowed = object.as_borrowed();
        if let Some(api) = exchange_api(object)? {
            // torch: a tensor that requires grad must not be edited behind autograd's back (the
            // reference's in-place `div_` raises there too).
            if let Ok(requires_grad) = object.getattr(pyo3::intern!(py, "requires_grad")) {
                if requires_grad.is_truthy()? {
                    return Err(new_err(
                        ErrorClass::ReadOnly,
                        format!(
                            "{name} require grad and cannot be edited in place; pass \
                             {name}.detach() or call under torch.no_grad()"
                        ),
                    ));
                }
            }
            // A borrowed view: no allocation and no Python call. Its metadata is copied out; the
            // data pointer lives as long as the object (torch keeps its storage).
            if let Ok(view) = api.with_tensor_view_no_sync(borrowed, |t, stream| {
                Self::from_dltensor(t, Some(stream), None)
            }) {
                return Ok(Self {
                    torch: true,
                    ..view
                });
            }
            let exchanged = api
                .import_managed_no_sync(borrowed)
                .map_err(|e| not_exported(object, name, e))?;
            let read_only = exchanged.tensor().flags().contains(DlpackFlags::READ_ONLY);
            // SAFETY: the managed tensor was validated on import and is alive here.
            let mut view = Self::from_dltensor(
                unsafe { exchanged.tensor().tensor() },
                Some(exchanged.current_work_stream()),
                None,
            );
            view.read_only = read_only;
            view.torch = true;
            return Ok(view);
        }
        let dlpack = pyo3::intern!(py, "__dlpack__");
        if !object.hasattr(dlpack)? {
            return Err(new_err(
                ErrorClass::DType,
                format!(
                    "{name}: expected a torch tensor or a numpy array (anything with __dlpack__), \
                     got {}",
                    object.get_type().name()?
                ),
            ));
        }
        // numpy signals a read-only array only in the versioned protocol, and only some producers
        // speak it, so the array's own flag is checked too.
        let mut read_only = false;
        if let Ok(flags) = object.getattr(pyo3::intern!(py, "flags")) {
            if let Ok(writeable) = flags.getattr(pyo3::intern!(py, "writeable")) {
                read_only = !writeable.is_truthy()?;
            }
        }
        // One Python call for the capsule (the versioned ABI first, the legacy one for producers
        // that do not take `max_version`), then dlpark consumes it.
        let kwargs = PyDict::new(py);
        kwargs.set_item(pyo3::intern!(py, "max_version"), (1u32, 3u32))?;
        let capsule = match object.call_method(dlpack, (), Some(&kwargs)) {
            Ok(capsule) => capsule,
            Err(e) if e.is_instance_of::<PyTypeError>(py) => object
                .call_method0(dlpack)
                .map_err(|e| not_exported(object, name, e))?,
            Err(e) => return Err(not_exported(object, name, e)),
        };
        let imported = from_dlpack(capsule.as_borrowed(), None, None)
            .map_err(|e| not_exported(object, name, e))?;
        read_only |= imported.flags().contains(DlpackFlags::READ_ONLY);
        // SAFETY: the managed tensor was validated on import and is kept alive in the view.
        let t = unsafe {
            match &imported {
                ImportedDlpack::Legacy(m) => *m.tensor(),
                ImportedDlpack::Versioned(m) => *m.tensor(),
            }
        };
        let mut view = Self::from_dltensor(&t, None, Some(imported));
        view.read_only = read_only;
        Ok(view)
    }

    /// After an edit in place of `object` (this view's tensor): bumps a torch tensor's autograd
    /// version counter, as torch's own in-place ops do, so that a backward pass that saved the
    /// tensor raises instead of using the edited values.
    pub fn edited(&self, object: &Bound<'_, PyAny>) -> PyResult<()> {
        static INCREMENT_VERSION: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        if !self.torch {
            return Ok(());
        }
        let py = object.py();
        INCREMENT_VERSION
            .get_or_try_init(py, || {
                Ok::<_, PyErr>(
                    py.import("torch.autograd.graph")?
                        .getattr("increment_version")?
                        .unbind(),
                )
            })?
            .call1(py, (object,))?;
        Ok(())
    }

    pub fn dtype_name(&self) -> String {
        dtype_name(self.dtype)
    }

    fn shape_text(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(i64::to_string).collect();
        match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.join(", ")),
        }
    }
}

/// The error for an object whose producer refused to export it (a meta tensor, a byte-swapped
/// array, ...): a `DeviceError` naming its device where that is not the host, else a `DTypeError`,
/// with the producer's first line of explanation and its exception as the cause.
fn not_exported(object: &Bound<'_, PyAny>, name: &str, error: PyErr) -> PyErr {
    let py = object.py();
    let why = error.to_string();
    let why = why.lines().next().unwrap_or_default();
    let device = object
        .getattr(pyo3::intern!(py, "device"))
        .and_then(|d| d.str().map(|s| s.to_string()))
        .ok()
        .filter(|d| d != "cpu");
    let ours = match device {
        Some(device) => new_err(
            ErrorClass::Device,
            format!("{name} is on {device}, which cannot be read through DLPack ({why})"),
        ),
        None => new_err(
            ErrorClass::DType,
            format!("{name} cannot be read through DLPack ({why})"),
        ),
    };
    ours.set_cause(py, Some(error));
    ours
}

fn dtype_name(dtype: DLDataType) -> String {
    let base = match dtype.code {
        DLDataTypeCode::FLOAT => "float",
        DLDataTypeCode::BFLOAT => "bfloat",
        DLDataTypeCode::INT => "int",
        DLDataTypeCode::UINT => "uint",
        DLDataTypeCode::BOOL => return "bool".into(),
        DLDataTypeCode::COMPLEX => "complex",
        _ => return format!("DLPack type code {} ({} bits)", dtype.code.0, dtype.bits),
    };
    match dtype.lanes {
        1 => format!("{base}{}", dtype.bits),
        lanes => format!("{base}{}x{lanes}", dtype.bits),
    }
}

/// A block of logits to edit in place: `rows` rows of `vocab` elements, `row_stride` apart.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub data: *mut u8,
    pub dtype: DType,
    pub rows: usize,
    pub vocab: usize,
    pub row_stride: usize,
    pub device: Device,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub stream: Option<u64>,
}

// SAFETY: a Block only carries the address of memory that the calling Python object owns and that
// the call holding the Block edits exclusively; it moves to worker threads for that call only.
unsafe impl Send for Block {}
unsafe impl Sync for Block {}

impl Block {
    /// Checks that `view` is logits of rank `rank` (1 for one row, 2 for a batch) that can be
    /// edited in place.
    pub fn from_view(view: &TensorView, rank: usize) -> PyResult<Self> {
        Self::checked(view, rank, true)
    }

    /// [`Block::from_view`] for logits that are only read (the source of an out-of-place apply):
    /// they may be read-only.
    pub fn source_from_view(view: &TensorView, rank: usize) -> PyResult<Self> {
        Self::checked(view, rank, false)
    }

    fn checked(view: &TensorView, rank: usize, written: bool) -> PyResult<Self> {
        let dtype = match (view.dtype.code, view.dtype.bits, view.dtype.lanes) {
            (DLDataTypeCode::FLOAT, 32, 1) => DType::F32,
            (DLDataTypeCode::FLOAT, 16, 1) => DType::F16,
            (DLDataTypeCode::BFLOAT, 16, 1) => DType::BF16,
            _ => {
                return Err(new_err(
                    ErrorClass::DType,
                    format!(
                        "logits must be float32, float16 or bfloat16, got {}",
                        view.dtype_name()
                    ),
                ))
            }
        };
        if view.shape.len() != rank {
            let expected = if rank == 1 {
                "1-D (vocab_size,)"
            } else {
                "2-D (rows, vocab_size)"
            };
            return Err(new_err(
                ErrorClass::Shape,
                format!("logits must be {expected}, got shape {}", view.shape_text()),
            ));
        }
        if written && view.read_only {
            return Err(new_err(
                ErrorClass::ReadOnly,
                "logits are read-only; they are edited in place",
            ));
        }
        let vocab = view.shape[rank - 1] as usize;
        let rows = if rank == 2 { view.shape[0] as usize } else { 1 };
        if vocab > 1 && view.strides[rank - 1] != 1 {
            return Err(new_err(
                ErrorClass::Shape,
                format!(
                    "logits must be contiguous in their last dimension (stride 1), got strides {:?}; \
                     they are edited in place, so no copy is made",
                    view.strides
                ),
            ));
        }
        let row_stride = if rank == 2 && rows > 1 {
            let stride = view.strides[0];
            if stride < vocab as i64 {
                return Err(new_err(
                    ErrorClass::Shape,
                    format!("logits rows overlap or run backwards: row stride {stride} with {vocab} logits per row"),
                ));
            }
            stride as usize
        } else {
            vocab
        };
        if rows * vocab > 0 && !(view.data as usize).is_multiple_of(dtype.size()) {
            return Err(new_err(
                ErrorClass::Shape,
                "logits are not aligned to their element size",
            ));
        }
        Ok(Self {
            data: view.data,
            dtype,
            rows,
            vocab,
            row_stride,
            device: view.device,
            stream: view.stream,
        })
    }

    pub fn layout(&self) -> BatchLayout {
        BatchLayout {
            rows: self.rows,
            row_stride: self.row_stride,
        }
    }

    /// Elements from the first to one past the last that the block covers.
    pub fn len(&self) -> usize {
        self.layout().required_len(self.vocab)
    }

    /// Whether the bytes the two blocks cover share any address.
    pub fn overlaps(&self, other: &Block) -> bool {
        let span = |b: &Block| {
            let start = b.data as usize;
            start..start + b.len() * b.dtype.size()
        };
        let (a, b) = (span(self), span(other));
        a.start < b.end && b.start < a.end
    }

    /// The block as a slice of `T`.
    ///
    /// # Safety
    /// `T` must be the block's dtype, the block must be on the host, and nothing else may access
    /// its memory while the slice lives.
    pub unsafe fn slice<'a, T>(&self) -> &'a mut [T] {
        let len = self.len();
        if len == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.data as *mut T, len)
    }
}

/// Integer elements of a token id tensor.
#[derive(Debug, Clone, Copy)]
pub(crate) enum IntKind {
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
}

impl IntKind {
    pub fn of(dtype: DLDataType) -> Option<Self> {
        Some(match (dtype.code, dtype.bits, dtype.lanes) {
            (DLDataTypeCode::INT, 8, 1) => IntKind::I8,
            (DLDataTypeCode::INT, 16, 1) => IntKind::I16,
            (DLDataTypeCode::INT, 32, 1) => IntKind::I32,
            (DLDataTypeCode::INT, 64, 1) => IntKind::I64,
            (DLDataTypeCode::UINT, 8, 1) => IntKind::U8,
            (DLDataTypeCode::UINT, 16, 1) => IntKind::U16,
            (DLDataTypeCode::UINT, 32, 1) => IntKind::U32,
            (DLDataTypeCode::UINT, 64, 1) => IntKind::U64,
            _ => return None,
        })
    }

    fn size(self) -> usize {
        match self {
            IntKind::I8 | IntKind::U8 => 1,
            IntKind::I16 | IntKind::U16 => 2,
            IntKind::I32 | IntKind::U32 => 4,
            IntKind::I64 | IntKind::U64 => 8,
        }
    }

    /// The element at `p`, widened.
    ///
    /// # Safety
    /// `p` must point to a readable element of this kind.
    unsafe fn read(self, p: *const u8) -> i128 {
        match self {
            IntKind::I8 => (p as *const i8).read_unaligned() as i128,
            IntKind::I16 => (p as *const i16).read_unaligned() as i128,
            IntKind::I32 => (p as *const i32).read_unaligned() as i128,
            IntKind::I64 => (p as *const i64).read_unaligned() as i128,
            IntKind::U8 => p.read() as i128,
            IntKind::U16 => (p as *const u16).read_unaligned() as i128,
            IntKind::U32 => (p as *const u32).read_unaligned() as i128,
            IntKind::U64 => (p as *const u64).read_unaligned() as i128,
        }
    }
}

/// A 1-D host tensor of integers, read in place.
pub(crate) struct IntArray {
    view: TensorView,
    kind: IntKind,
    len: usize,
    stride_bytes: isize,
}

impl IntArray {
    /// `Ok(None)` when `view` holds no integers (the caller decides what else to try).
    pub fn from_view(view: TensorView) -> PyResult<Option<Self>> {
        let Some(kind) = IntKind::of(view.dtype) else {
            return Ok(None);
        };
        if view.device != Device::Cpu {
            return Err(new_err(
                ErrorClass::Device,
                format!(
                    "input_ids are on {}; pass them on the host (a list or a CPU tensor)",
                    view.device
                ),
            ));
        }
        if view.shape.len() != 1 {
            return Err(new_err(
                ErrorClass::Shape,
                format!("input_ids must be 1-D, got shape {}", view.shape_text()),
            ));
        }
        let len = view.shape[0].max(0) as usize;
        let stride_bytes = view.strides[0] as isize * kind.size() as isize;
        Ok(Some(Self {
            view,
            kind,
            len,
            stride_bytes,
        }))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The id at `index < len`, or `None` when it is negative or above `u32::MAX`.
    pub fn get(&self, index: usize) -> Option<u32> {
        debug_assert!(index < self.len);
        // SAFETY: index < len, and the view's strides describe where each element lies.
        let value = unsafe {
            self.kind
                .read(self.view.data.offset(index as isize * self.stride_bytes))
        };
        u32::try_from(value).ok()
    }
}

/// A caller's bitmask (`Batch.apply(..., bitmask=...)`), checked: a host tensor of 32-bit
/// integers shaped `[rows, words_per_row]`, C-contiguous and aligned.
pub(crate) struct BitmaskView {
    view: TensorView,
    len: usize,
}

impl BitmaskView {
    /// The mask's words.
    ///
    /// # Safety
    /// The tensor the view was read from must be alive and unchanged while the slice is used.
    pub unsafe fn words(&self) -> &[u32] {
        std::slice::from_raw_parts(self.view.data as *const u32, self.len)
    }
}

/// Reads and checks a caller's bitmask for a block of `rows` rows.
pub(crate) fn bitmask_words(
    object: &Bound<'_, PyAny>,
    rows: usize,
    words_per_row: usize,
) -> PyResult<BitmaskView> {
    let view = TensorView::of_named(object, "bitmask")?;
    if !matches!(IntKind::of(view.dtype), Some(IntKind::I32 | IntKind::U32)) {
        return Err(new_err(
            ErrorClass::DType,
            format!(
                "bitmask must be int32 (or uint32), got {}",
                view.dtype_name()
            ),
        ));
    }
    if view.device != Device::Cpu {
        return Err(new_err(
            ErrorClass::Device,
            format!("bitmask is on {}; pass it on the host", view.device),
        ));
    }
    let expected = [rows as i64, words_per_row as i64];
    if view.shape != expected {
        return Err(new_err(
            ErrorClass::Shape,
            format!(
                "bitmask must be [rows, ceil(vocab_size / 32)] = ({rows}, {words_per_row}), got {}",
                view.shape_text()
            ),
        ));
    }
    let contiguous = rows <= 1 || view.strides[0] == words_per_row as i64;
    if !contiguous || (words_per_row > 1 && view.strides[1] != 1) {
        return Err(new_err(ErrorClass::Shape, "bitmask must be C-contiguous"));
    }
    if !(view.data as usize).is_multiple_of(4) {
        return Err(new_err(
            ErrorClass::Shape,
            "bitmask's data is not 4-byte aligned",
        ));
    }
    Ok(BitmaskView {
        view,
        len: rows * words_per_row,
    })
}
