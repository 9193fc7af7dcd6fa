//! `Module`: what every layer and every `#[model]` struct is: seeded init and a visitor over
//! its parameters with PyTorch-style dotted names (`fc1.weight`).

use crate::rng::Rng;
use crate::tensor::Tensor;
use std::borrow::Cow;

pub trait Module {
    /// Fresh parameters drawn from `rng` with PyTorch's default scheme for each layer.
    fn init_with(rng: &mut Rng) -> Self
    where
        Self: Sized;

    /// Calls `f` on every parameter, in declaration order, with its dotted name under `prefix`.
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor));

    /// Like `visit_params`, with mutable access (optimizers, checkpoint loading).
    fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor));

    /// Seeded init: the same seed gives the same parameters on every machine.
    fn init(seed: u64) -> Self
    where
        Self: Sized,
    {
        Self::init_with(&mut Rng::new(seed))
    }

    /// Total number of scalar parameters.
    fn num_params(&self) -> usize {
        let mut n = 0;
        self.visit_params("", &mut |_, t| n += t.numel());
        n
    }

    /// Moves every parameter to `device` (`Device::Cpu` brings them back). All or nothing:
    /// when one cannot be moved, the model keeps its parameters where they were.
    fn to(&mut self, device: &crate::Device) -> crate::Result<()>
    where
        Self: Sized,
    {
        let mut moved = Vec::new();
        let mut first_err = None;
        self.visit_params("", &mut |_, t| {
            if first_err.is_none() {
                match t.to(device) {
                    Ok(m) => moved.push(m),
                    Err(e) => first_err = Some(e),
                }
            }
        });
        if let Some(e) = first_err {
            return Err(e);
        }
        let mut moved = moved.into_iter();
        self.visit_params_mut("", &mut |_, t| {
            if let Some(m) = moved.next() {
                *t = m;
            }
        });
        Ok(())
    }

    /// `(name, tensor)` for every parameter, in declaration order.
    fn named_params(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit_params("", &mut |name, t| out.push((name.to_string(), t.clone())));
        out
    }
}

/// Repeated blocks (`blocks: [Block; 4]`): element `i` is named `blocks.i`, as in a PyTorch
/// `nn.ModuleList`, and is initialized after element `i - 1` from the same generator.
impl<M: Module, const N: usize> Module for [M; N] {
    fn init_with(rng: &mut Rng) -> Self {
        std::array::from_fn(|_| M::init_with(rng))
    }

    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        for (i, m) in self.iter().enumerate() {
            with_name(prefix, &index_name(i), |name| m.visit_params(name, f));
        }
    }

    fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        for (i, m) in self.iter_mut().enumerate() {
            with_name(prefix, &index_name(i), |name| m.visit_params_mut(name, f));
        }
    }
}

/// The name of element `i` of repeated blocks; the common small indices without allocating
/// (an optimizer step visits every parameter by name each step).
fn index_name(i: usize) -> Cow<'static, str> {
    const SMALL: [&str; 32] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
        "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31",
    ];
    match SMALL.get(i) {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(i.to_string()),
    }
}

/// `prefix.name`, or `name` at the top level.
pub fn join_name(prefix: &str, name: &str) -> String {
    let mut out = String::new();
    write_name(&mut out, prefix, name);
    out
}

fn write_name(out: &mut String, prefix: &str, name: &str) {
    out.clear();
    if !prefix.is_empty() {
        out.push_str(prefix);
        out.push('.');
    }
    out.push_str(name);
}

thread_local! {
    /// Name buffers for `with_name`, one per nesting level in use, kept between calls.
    static NAME_BUFFERS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Calls `f` with `prefix.name` (or `name` at the top level) built in a reused buffer, so
/// visiting a model's parameters allocates nothing once the buffers exist (an optimizer step
/// visits them every step).
pub fn with_name<R>(prefix: &str, name: &str, f: impl FnOnce(&str) -> R) -> R {
    let mut buffer = NAME_BUFFERS
        .with(|b| b.borrow_mut().pop())
        .unwrap_or_default();
    write_name(&mut buffer, prefix, name);
    let result = f(&buffer);
    NAME_BUFFERS.with(|b| b.borrow_mut().push(buffer));
    result
}

type GradEntries = Vec<(Cow<'static, str>, Tensor)>;

/// The entry list of the last dropped `Grads`, reused by the next (a training step makes one
/// per step, maybe on a pool thread, and the caller's thread drops it).
static SPARE_ENTRIES: std::sync::Mutex<GradEntries> = std::sync::Mutex::new(Vec::new());

/// Gradients of a scalar with respect to every parameter, in the model's parameter order.
#[derive(Clone, Debug, Default)]
pub struct Grads {
    entries: GradEntries,
}

impl Drop for Grads {
    fn drop(&mut self) {
        let mut entries = std::mem::take(&mut self.entries);
        entries.clear();
        if let Ok(mut spare) = SPARE_ENTRIES.lock()
            && spare.capacity() < entries.capacity()
        {
            *spare = entries;
        }
    }
}

impl Grads {
    pub fn new() -> Grads {
        Grads {
            entries: SPARE_ENTRIES
                .lock()
                .map(|mut spare| std::mem::take(&mut *spare))
                .unwrap_or_default(),
        }
    }

    /// Adds the gradient of `name`; a `&'static str` name (what compiled models pass) is kept
    /// without a copy.
    pub fn push(&mut self, name: impl Into<Cow<'static, str>>, grad: Tensor) {
        self.entries.push((name.into(), grad));
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.entries.iter().map(|(n, t)| (n.as_ref(), t))
    }

    /// The gradients themselves, to update in place (`clip_grad_norm`).
    pub(crate) fn tensors_mut(&mut self) -> impl Iterator<Item = &mut Tensor> {
        self.entries.iter_mut().map(|(_, t)| t)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Replaces every gradient by `f` of it (clipping, scaling); stops at the first error,
    /// leaving the gradients before it replaced.
    pub fn map_each(
        &mut self,
        mut f: impl FnMut(&Tensor) -> crate::Result<Tensor>,
    ) -> crate::Result<()> {
        for (_, g) in &mut self.entries {
            *g = f(g)?;
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
