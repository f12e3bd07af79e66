//! A processor for the tests of a batch's plan validation only.

use logits_processing::{LogitsProcessor, Result as CoreResult, RowPlan, TokenHistory};
use pyo3::prelude::*;

/// For the tests of a batch's plan validation: a pipeline step that, when the last id is
/// `on_id`, plans a token outside any vocab without saying so in `max_token_id` (no built-in
/// does; a processor added later might).
#[pyclass(module = "logits_processing._lib", name = "_OutOfVocabForTests")]
pub(crate) struct PyOutOfVocabForTests {
    on_id: u32,
}

impl PyOutOfVocabForTests {
    pub(super) fn processor(&self) -> Box<dyn LogitsProcessor> {
        Box::new(OutOfVocab { on_id: self.on_id })
    }
}

#[pymethods]
impl PyOutOfVocabForTests {
    #[new]
    fn new(on_id: u32) -> Self {
        Self { on_id }
    }
}

#[derive(Debug)]
struct OutOfVocab {
    on_id: u32,
}

impl LogitsProcessor for OutOfVocab {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> CoreResult<()> {
        if ids.last_token() == Some(self.on_id) {
            plan.push(logits_processing::Edit::Ban {
                token: u32::MAX - 1,
            });
        }
        Ok(())
    }

    fn undo(&mut self) {}
}
