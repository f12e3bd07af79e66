//! `logits_processing._lib`: the Python extension over the `logits-processing` core.
//!
//! Thin by design: each class holds the core's value, tensors arrive through DLPack and are edited
//! in place, and every core error becomes its own Python exception class ([`errors`]). The
//! pure-Python package `logits_processing` around it holds the protocol, the dataclass and the
//! tokenizer glue.

mod args;
mod batch;
mod context;
mod device;
mod errors;
mod exclusive;
mod history;
mod info;
mod reference;
mod spec_processor;
mod specs;
mod synthid;
mod tensor;
mod thinking;
mod tokenizer;
mod watch;
mod watermark;

use logits_processing::processors::lookup_thinking_token_config;
use logits_processing::{register_thinking_token_config, TextEncoder, ThinkingTokenConfig};
use pyo3::prelude::*;

use crate::tokenizer::PyEncoder;

/// `((start, end, newline), key)` for `model_name` by the core's rule (the tokenizer's single
/// tokens, then the table, else `(0, 0, 10)`), and the table key whose entry that is (or None).
/// Wrapped by `logits_processing.get_thinking_token_config`.
#[pyfunction]
#[pyo3(signature = (model_name, tokenizer = None))]
fn thinking_token_ids(
    model_name: &Bound<'_, PyAny>,
    tokenizer: Option<Bound<'_, PyAny>>,
) -> PyResult<((u32, u32, u32), Option<String>)> {
    let model_name = args::text(model_name, "model_name")?;
    let encoder = tokenizer.filter(|t| !t.is_none()).map(PyEncoder);
    let (c, key) =
        lookup_thinking_token_config(&model_name, encoder.as_ref().map(|e| e as &dyn TextEncoder));
    Ok(((c.start_token_id, c.end_token_id, c.newline_token_id), key))
}

/// Adds or replaces `model_key.lower()` in the thinking-token table. Wrapped by
/// `logits_processing.register_thinking_token_config`.
#[pyfunction]
fn register_thinking_token_ids(
    model_key: &Bound<'_, PyAny>,
    start: &Bound<'_, PyAny>,
    end: &Bound<'_, PyAny>,
    newline: &Bound<'_, PyAny>,
) -> PyResult<()> {
    register_thinking_token_config(
        &args::text(model_key, "model_key")?,
        ThinkingTokenConfig {
            start_token_id: args::token_id(start, "config.start_token_id")?,
            end_token_id: args::token_id(end, "config.end_token_id")?,
            newline_token_id: args::token_id(newline, "config.newline_token_id")?,
        },
    );
    Ok(())
}

/// Whether any of `specs` reads the request's token ids (or counts its steps). Rows whose specs
/// read none (temperature, biases, bans, allowed ids, the caller's bitmask, truncation) can be
/// planned without the newest sampled token, so an engine that runs ahead of its history (vLLM's
/// Model Runner V2) need not wait for the device to process them.
///
/// Args:
///     specs: JSON text (one spec object or a list), a dict, or a list of dicts / JSON texts.
///
/// Raises:
///     SpecError: for a spec that does not parse, naming the field.
///
/// Example:
///     >>> from logits_processing import reads_history
///     >>> reads_history([{"kind": "temperature", "temperature": 0.7}, {"kind": "top_p", "p": 0.9}])
///     False
///     >>> reads_history({"kind": "repetition_penalty", "penalty": 1.2})
///     True
#[pyfunction]
fn reads_history(specs: &Bound<'_, PyAny>) -> PyResult<bool> {
    let entries = specs::entries_of(specs, false)?;
    Ok(entries.iter().any(|(_, entry)| match entry {
        specs::Entry::Specs(specs) => specs
            .iter()
            .any(logits_processing::ProcessorSpec::reads_history),
        _ => true,
    }))
}

/// Whether any of `specs` depends on where the prompt ends in the ids, so that a row of them
/// needs ``prompt_len`` (:meth:`Batch.add`, :class:`Processor`): grammars and ``json_object``
/// read the output alone; frequency and presence penalties, and a repetition penalty scoped to
/// ``"output"`` or ``"prompt"``, count one side of it; ``min_new_tokens``, the exponential decay
/// length penalty and ``suppress_tokens_at_begin`` without ``begin_index`` count new tokens; a
/// forced sequence or ``hello_world`` with ``"position": "tokens"`` counts generated ids, and
/// ``synthid_watermark`` hashes them.
///
/// Args:
///     specs: JSON text (one spec object or a list), a dict, or a list of dicts / JSON texts.
///
/// Raises:
///     SpecError: for a spec that does not parse, naming the field.
///
/// Example:
///     >>> from logits_processing import needs_prompt_len
///     >>> needs_prompt_len([{"kind": "temperature", "temperature": 0.7}, {"kind": "repetition_penalty", "penalty": 1.2}])
///     False
///     >>> needs_prompt_len({"kind": "min_new_tokens", "min_new_tokens": 3, "eos_token_ids": [2]})
///     True
#[pyfunction]
fn needs_prompt_len(specs: &Bound<'_, PyAny>) -> PyResult<bool> {
    let entries = specs::entries_any_order(specs, false)?;
    Ok(entries.iter().any(|(_, entry)| match entry {
        specs::Entry::Specs(specs) => specs.iter().any(|spec| spec.needs_prompt_len()),
        _ => false,
    }))
}

/// Whether any of `specs` can need the engine's token texts (the decoded text of every token):
/// ``ban_strings``, DRY's text breakers, ``multiple_choice``, grammars. An engine that loads its
/// tokenizer lazily (SGLang's scheduler) loads it for a row of such specs. The kind's registry
/// entry answers (see :func:`kind_info`).
///
/// Args:
///     specs: JSON text (one spec object or a list), a dict, or a list of dicts / JSON texts.
///
/// Raises:
///     SpecError: for a spec that does not parse, naming the field.
///
/// Example:
///     >>> from logits_processing import needs_token_texts
///     >>> needs_token_texts([{"kind": "temperature", "temperature": 0.7}])
///     False
///     >>> needs_token_texts({"kind": "ban_strings", "strings": ["as an AI"]})
///     True
#[pyfunction]
fn needs_token_texts(specs: &Bound<'_, PyAny>) -> PyResult<bool> {
    let entries = specs::entries_any_order(specs, false)?;
    Ok(entries.iter().any(|(_, entry)| match entry {
        specs::Entry::Specs(specs) => specs
            .iter()
            .any(logits_processing::ProcessorSpec::needs_token_texts),
        _ => false,
    }))
}

/// What the registered kind `name` is, as its registry entry says: whether its specs read the
/// request's ids (``reads_history``), whether it allows only some tokens whatever their logits
/// (``masks``: listed before any truncation), whether it cuts a row by its values
/// (``truncates``), whether its specs can need the engine's token texts
/// (``needs_token_texts``), and whether some of its steps hold an edit
/// the device kernels do not carry out (``edits_on_host``: on a GPU those steps take the host
/// round trip, docs/cuda.md). Whether a spec needs ``prompt_len`` depends on its fields: ask
/// :func:`needs_prompt_len`.
///
/// Args:
///     name (str): A kind, as :func:`kinds` lists them.
///
/// Returns:
///     dict[str, bool]: the five answers.
///
/// Raises:
///     SpecError: for a name that is not a registered kind, listing them.
///
/// Example:
///     >>> from logits_processing import kind_info
///     >>> kind_info("top_p")
///     {'reads_history': False, 'masks': False, 'truncates': True, 'needs_token_texts': False, 'edits_on_host': False}
///     >>> kind_info("ban_strings")["needs_token_texts"]
///     True
#[pyfunction]
fn kind_info<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    let Some(kind) = logits_processing::spec::kind(name) else {
        let known: Vec<&str> = logits_processing::spec::kinds().collect();
        return Err(errors::to_py(logits_processing::Error::InvalidSpec {
            field: "kind".into(),
            message: format!("unknown kind '{name}'; known kinds: {}", known.join(", ")),
        }));
    };
    let info = pyo3::types::PyDict::new(py);
    info.set_item("reads_history", kind.reads_history())?;
    info.set_item("masks", kind.masks())?;
    info.set_item("truncates", kind.truncates())?;
    info.set_item("needs_token_texts", kind.needs_token_texts())?;
    info.set_item("edits_on_host", kind.edits_on_host())?;
    Ok(info)
}

/// The specs in the canonical order: biases and penalties; bans and masks (allowed ids, grammars,
/// the caller's bitmask), then forced tokens; the thinking budget; temperature; truncation. Specs
/// of one kind keep their order. A list that runs a mask after a truncation step is refused (a
/// row could be left with no token); this is the order that never is.
///
/// Args:
///     specs: JSON text (one spec object or a list), a dict, or a list of dicts / JSON texts.
///
/// Returns:
///     list[dict]: the specs, as given, reordered.
///
/// Raises:
///     SpecError: for a spec that does not parse, naming the field.
///
/// Example:
///     >>> from logits_processing import canonical_order
///     >>> [s["kind"] for s in canonical_order([
///     ...     {"kind": "temperature", "temperature": 0.7},
///     ...     {"kind": "top_p", "p": 0.9},
///     ...     {"kind": "repetition_penalty", "penalty": 1.1},
///     ...     {"kind": "json_object"},
///     ... ])]
///     ['repetition_penalty', 'json_object', 'temperature', 'top_p']
#[pyfunction]
fn canonical_order<'py>(specs: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let mut parsed = vec![];
    for (_, entry) in specs::entries_any_order(specs, false)? {
        if let specs::Entry::Specs(specs) = entry {
            parsed.extend(specs);
        }
    }
    let ordered: Vec<_> = logits_processing::canonical_order(parsed)
        .iter()
        .map(|spec| spec.to_value())
        .collect();
    let text = serde_json::to_string(&ordered).expect("specs are plain data");
    specs.py().import("json")?.call_method1("loads", (text,))
}

/// Every spec kind's name, in the canonical order (biases and penalties, bans and masks, forced
/// tokens, the thinking budget, temperature, truncation).
///
/// Example:
///     >>> from logits_processing import kinds
///     >>> kinds()[:3]
///     ['logit_bias', 'sequence_bias', 'repetition_penalty']
#[pyfunction]
fn kinds() -> Vec<&'static str> {
    logits_processing::spec::kinds().collect()
}

/// Sends host tensors through the device path's host round trip (their rows copied to a staging
/// buffer, edited there, copied back, as a device's are), for the tests of that path on machines
/// without a GPU. Returns the previous setting.
#[cfg(feature = "cuda")]
#[pyfunction]
fn _round_trip_host_tensors(on: bool) -> bool {
    device::cuda::ROUND_TRIP_HOST_TENSORS.swap(on, std::sync::atomic::Ordering::Relaxed)
}

/// The waits for copies the host round trip has made in this process (host tensors, under the
/// hook above).
#[cfg(feature = "cuda")]
#[pyfunction]
fn _round_trip_waits() -> usize {
    device::cuda::ROUND_TRIP_WAITS.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many times the device path has waited for the device in this process
/// (`logits_processing_cuda::device_waits`).
#[cfg(feature = "cuda")]
#[pyfunction]
fn _device_waits() -> usize {
    logits_processing_cuda::device_waits()
}

/// A case of the CUDA crate's tests (`logits_processing_cuda::testing::kernel_case`), packed as
/// the kernels read it: a dict of `words` (bytes of u32), `slots`, `list_at`, `truncating`, `rows`,
/// `row_stride`, `vocab`, `input` and `expected` (the block's bytes before and after the CPU path,
/// in `dtype`), for the Python suite to run the kernels on through Triton's interpreter.
#[cfg(feature = "cuda")]
#[pyfunction]
fn _kernel_case<'py>(
    py: Python<'py>,
    name: &str,
    seed: u64,
    vocab: usize,
    dtype: &str,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    use logits_processing::{bf16, f16, Logit};
    use logits_processing_cuda::packed::PackedPlans;
    use logits_processing_cuda::testing::{cpu_apply, kernel_case};
    fn bytes_of<T: Logit>(xs: &[T]) -> Vec<u8> {
        // SAFETY: f32, f16 and bf16 are plain bits, without padding.
        unsafe { std::slice::from_raw_parts(xs.as_ptr().cast::<u8>(), std::mem::size_of_val(xs)) }
            .to_vec()
    }
    fn case<T: Logit>(
        name: &str,
        seed: u64,
        vocab: usize,
    ) -> Result<
        (
            PackedPlans,
            logits_processing::BatchLayout,
            Vec<u8>,
            Vec<u8>,
        ),
        String,
    > {
        let (layout, input, mut listed) = kernel_case::<T>(name, seed, vocab)?;
        let expected = cpu_apply(&input, layout, vocab, &mut listed);
        let mut packed = PackedPlans::new();
        packed
            .pack(|| listed.iter().map(|(r, p)| (*r, p)), layout.rows, vocab)
            .map_err(|e| e.to_string())?;
        Ok((packed, layout, bytes_of(&input), bytes_of(&expected)))
    }
    let made = match dtype {
        "float32" => case::<f32>(name, seed, vocab),
        "float16" => case::<f16>(name, seed, vocab),
        "bfloat16" => case::<bf16>(name, seed, vocab),
        other => Err(format!("no dtype {other:?}")),
    };
    let (packed, layout, input, expected) =
        made.map_err(pyo3::exceptions::PyValueError::new_err)?;
    let (list_at, truncating) = packed.truncating();
    let words: Vec<u8> = packed
        .words()
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect();
    let out = pyo3::types::PyDict::new(py);
    out.set_item("words", pyo3::types::PyBytes::new(py, &words))?;
    out.set_item("snapshot_words", packed.snapshot_words())?;
    out.set_item("slots", packed.slots())?;
    out.set_item("list_at", list_at)?;
    out.set_item("truncating", truncating)?;
    out.set_item("rows", layout.rows)?;
    out.set_item("row_stride", layout.row_stride)?;
    out.set_item("vocab", vocab)?;
    out.set_item("input", pyo3::types::PyBytes::new(py, &input))?;
    out.set_item("expected", pyo3::types::PyBytes::new(py, &expected))?;
    Ok(out)
}

/// The packed layout's constants, op codes, rule codes and exp's coefficients, by name (ints and
/// floats): what `logits_processing.kernels` (the Triton kernels) is written against, from their
/// one definition in the CUDA crate.
#[cfg(feature = "cuda")]
#[pyfunction]
fn _device_layout(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use logits_processing_cuda::packed::{constants, Constant};
    let layout = pyo3::types::PyDict::new(py);
    for (name, value) in constants() {
        match value {
            Constant::Int(v) => layout.set_item(name, v)?,
            Constant::Float(x) => layout.set_item(name, x as f64)?,
            Constant::Double(x) => layout.set_item(name, x)?,
        }
    }
    Ok(layout)
}

/// Panics inside Rust, for the tests that show a panic becomes an exception, never an abort.
/// With `in_pool`, the panic happens on a worker thread with the GIL released.
#[pyfunction]
fn _panic_for_tests(py: Python<'_>, in_pool: bool) {
    if in_pool {
        py.detach(|| {
            use rayon::prelude::*;
            (0..4).into_par_iter().for_each(|i| {
                if i == 3 {
                    panic!("a test panic on a worker thread");
                }
            })
        });
    }
    panic!("a test panic");
}

#[pymodule]
fn _lib(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CUDA_SUPPORT", cfg!(feature = "cuda"))?;
    m.add(
        "HELLO_WORLD_TEXT",
        logits_processing::processors::HELLO_WORLD_TEXT,
    )?;
    errors::register(m)?;
    m.add_class::<reference::PyTemperature>()?;
    m.add_class::<reference::PyForcedSequence>()?;
    m.add_class::<reference::PyThinkingBudget>()?;
    m.add_class::<batch::PyBatch>()?;
    m.add_class::<tokenizer::PyVocab>()?;
    m.add_class::<context::PyEngineContext>()?;
    m.add_class::<spec_processor::PyProcessor>()?;
    m.add_function(wrap_pyfunction!(specs::validate_specs, m)?)?;
    m.add_function(wrap_pyfunction!(synthid::synthid_g_values, m)?)?;
    m.add_function(wrap_pyfunction!(
        synthid::synthid_context_repetition_mask,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(specs::resolve_specs, m)?)?;
    m.add_function(wrap_pyfunction!(thinking_token_ids, m)?)?;
    m.add_function(wrap_pyfunction!(register_thinking_token_ids, m)?)?;
    m.add_function(wrap_pyfunction!(context::hello_world_ids, m)?)?;
    m.add_function(wrap_pyfunction!(thinking::thinking_token_table, m)?)?;
    m.add_function(wrap_pyfunction!(specs::position_by_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(reads_history, m)?)?;
    m.add_function(wrap_pyfunction!(specs::refuse_caller_mask_py, m)?)?;
    m.add_function(wrap_pyfunction!(needs_prompt_len, m)?)?;
    m.add_function(wrap_pyfunction!(needs_token_texts, m)?)?;
    m.add_function(wrap_pyfunction!(kind_info, m)?)?;
    m.add_function(wrap_pyfunction!(kinds, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_order, m)?)?;
    m.add_function(wrap_pyfunction!(info::spec_schema, m)?)?;
    m.add_function(wrap_pyfunction!(info::build_info, m)?)?;
    m.add_function(wrap_pyfunction!(watermark::detect_watermark, m)?)?;
    #[cfg(feature = "cuda")]
    m.add_function(wrap_pyfunction!(_device_layout, m)?)?;
    // Hooks for the test suite, kept out of the shipped module's surface: only with
    // LOGITS_PROCESSING_TEST_HOOKS set when it is imported (python/tests/conftest.py sets it).
    if std::env::var_os("LOGITS_PROCESSING_TEST_HOOKS").is_some() {
        let testing = PyModule::new(m.py(), "_testing")?;
        testing.add_function(wrap_pyfunction!(_panic_for_tests, &testing)?)?;
        testing.add_class::<reference::PyOutOfVocabForTests>()?;
        #[cfg(feature = "cuda")]
        {
            testing.add_function(wrap_pyfunction!(_round_trip_host_tensors, &testing)?)?;
            testing.add_function(wrap_pyfunction!(_round_trip_waits, &testing)?)?;
            testing.add_function(wrap_pyfunction!(_kernel_case, &testing)?)?;
            testing.add_function(wrap_pyfunction!(_device_waits, &testing)?)?;
        }
        m.add_submodule(&testing)?;
    }
    Ok(())
}
