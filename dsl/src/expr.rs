//! Rhai, sandboxed: the expression language of `when`, `until`, reflex
//! conditions and `{{ }}` interpolations, and the engine that runs `.rhai`
//! workflow scripts.
//!
//! Rhai here is untrusted input. Every engine comes from [`sandbox`]: no
//! modules, no `eval`, no printing, no closures that capture variables, no
//! `curry`, and limits on operations, wall-clock time, call depth, expression
//! depth, variables, functions and the size of strings, arrays and maps. An
//! endless loop ends with "too many operations", a slow one with "took too
//! long", a huge string with "string too large"; all are errors, never hangs
//! or aborts.
//!
//! Every compilation and evaluation runs on the big-stack threads of
//! [`crate::pool`], whatever thread calls it: how deep a value or an
//! expression may nest is bounded by the limits here, and the pool's stack is
//! sized to hold that depth.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rhai::packages::{Package, StandardPackage};
use rhai::{AST, Dynamic, Engine, EvalAltResult, ParseError, ParseErrorType, Position, Scope};

use crate::ir::Expr;
pub use crate::truth::Truth;
pub use crate::value::{Bindings, Value};

/// Resource limits of one sandboxed engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most Rhai operations per evaluation.
    pub max_operations: u64,
    /// Deepest function call nesting.
    pub max_call_levels: usize,
    /// Deepest expression nesting (global, in functions).
    pub max_expr_depth: (usize, usize),
    /// Largest string, in bytes.
    pub max_string_size: usize,
    /// Largest array, in items.
    pub max_array_size: usize,
    /// Largest object map, in entries.
    pub max_map_size: usize,
    /// Most variables alive at once.
    pub max_variables: usize,
    /// Most functions a script may define.
    pub max_functions: usize,
    /// Wall-clock budget of one evaluation, in milliseconds: past it the
    /// evaluation stops with "took too long", however few operations it ran.
    pub budget_ms: u64,
}

/// Limits for conditions and interpolations: they run on every step and
/// every telemetry sample, so they are small (about a millisecond of work).
pub const EXPR_LIMITS: Limits = Limits {
    max_operations: 100_000,
    max_call_levels: 16,
    max_expr_depth: (64, 32),
    max_string_size: 1 << 20,
    max_array_size: 10_000,
    max_map_size: 10_000,
    max_variables: 256,
    max_functions: 16,
    budget_ms: 250,
};

/// Limits for whole `.rhai` workflow scripts, run once at load time.
pub const SCRIPT_LIMITS: Limits = Limits {
    max_operations: 2_000_000,
    max_call_levels: 32,
    max_expr_depth: (64, 32),
    max_string_size: 1 << 20,
    // Arrays nest as deep as they are large, and Rhai compares nested arrays
    // by native recursion (about 1.6 KiB of stack a level): this size keeps
    // the deepest value within the pool's stack (see `crate::pool`).
    max_array_size: 10_000,
    max_map_size: 10_000,
    max_variables: 1_000,
    max_functions: 256,
    budget_ms: 2_000,
};

/// Deepest value an evaluation may hand back to its caller (arrays and maps
/// within each other): deeper results are refused on the pool's thread, so a
/// caller's small stack never has to walk or drop them.
pub const MAX_RESULT_DEPTH: usize = 32;

thread_local! {
    /// When the evaluation running on this thread must stop.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Run `f` with a deadline `budget_ms` from now for the Rhai engines of this
/// thread (see [`sandbox`]), then clear it.
pub(crate) fn with_budget<T>(budget_ms: u64, f: impl FnOnce() -> T) -> T {
    let before = DEADLINE.with(|d| d.replace(Some(Instant::now() + Duration::from_millis(budget_ms))));
    let out = f();
    DEADLINE.with(|d| d.set(before));
    out
}

/// Operations between two looks at the clock.
const CLOCK_EVERY_OPS: u64 = 1_024;

/// What an evaluation stopped by its deadline returns to Rhai.
const DEADLINE_PASSED: &str = "deadline";

/// A sandboxed Rhai engine with `limits`: the standard library for strings,
/// numbers, arrays and maps; no modules, `eval`, printing or I/O.
pub fn sandbox(limits: Limits) -> Engine {
    // Building the standard library is the costly part of a new engine; it is
    // immutable, so every engine shares one copy.
    static STDLIB: OnceLock<rhai::Shared<rhai::Module>> = OnceLock::new();
    let mut engine = Engine::new_raw();
    engine.register_global_module(STDLIB.get_or_init(|| StandardPackage::new().as_shared_module()).clone());
    engine
        .set_max_operations(limits.max_operations)
        .set_max_call_levels(limits.max_call_levels)
        .set_max_expr_depths(limits.max_expr_depth.0, limits.max_expr_depth.1)
        .set_max_string_size(limits.max_string_size)
        .set_max_array_size(limits.max_array_size)
        .set_max_map_size(limits.max_map_size)
        .set_max_variables(limits.max_variables)
        .set_max_functions(limits.max_functions)
        .set_strict_variables(true)
        .set_fail_on_invalid_map_property(false);
    engine.disable_symbol("eval");
    // A curried function pointer holds values that nothing counts against the
    // size limits: chained, they nest without bound (and their drop recurses
    // as deep). Closures that capture are refused by the `no_closure` build.
    engine.disable_symbol("curry");
    engine.on_progress(|ops| {
        if ops % CLOCK_EVERY_OPS != 0 {
            return None;
        }
        let passed = DEADLINE.with(Cell::get).is_some_and(|at| Instant::now() >= at);
        passed.then(|| Dynamic::from(DEADLINE_PASSED))
    });
    engine.on_print(|_| {});
    engine.on_debug(|_, _, _| {});
    engine
}

/// Where an expression is evaluated, which decides the variables it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// A step's `when`, `for_each` or a prompt interpolation: `inputs`, `steps`.
    Step,
    /// The prompt of a step with `for_each`: `inputs`, `steps`, `item` (the
    /// current item) and `index` (its position, from 0).
    Item,
    /// A `repeat.until`: `inputs`, `steps`, `iteration`.
    Until,
    /// A reflex `when`/`release`: `gpu`, `node`, `agent`.
    Reflex,
}

/// Fields of a finished step visible as `steps.<id>.<field>`.
pub const STEP_FIELDS: &[&str] = &["output", "status", "attempts", "agent"];
/// `gpu.*` metrics of reflex conditions.
pub const GPU_METRICS: &[&str] = &["util", "mem_used_frac", "temp", "power_frac", "throttled", "ecc_rate"];
/// `node.*` metrics.
pub const NODE_METRICS: &[&str] = &["down"];
/// `agent.*` metrics.
pub const AGENT_METRICS: &[&str] = &["queue_depth", "latency_p95_ms", "tokens_per_s", "sessions"];

impl Context {
    /// Variables in scope.
    pub fn variables(self) -> &'static [&'static str] {
        match self {
            Context::Step => &["inputs", "steps"],
            Context::Item => &["inputs", "steps", "item", "index"],
            Context::Until => &["inputs", "steps", "iteration"],
            Context::Reflex => &["gpu", "node", "agent"],
        }
    }

    /// A scope holding every variable of this context (as unit values), to
    /// compile against with strict variables. Not constants: the optimizer would
    /// fold a bare variable (`{{ item }}`) into the unit value.
    fn scope(self) -> Scope<'static> {
        let mut scope = Scope::new();
        for v in self.variables() {
            scope.push_dynamic(*v, Dynamic::UNIT);
        }
        scope
    }
}

/// Why an expression failed to compile or to evaluate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExprError {
    /// What went wrong, in Rhai's words.
    pub message: String,
    /// Byte offset within the expression text, when Rhai reported one.
    pub offset: Option<usize>,
    /// The kind of failure.
    pub kind: ExprErrorKind,
}

/// Kinds of [`ExprError`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExprErrorKind {
    /// Not valid Rhai.
    Syntax,
    /// A variable that is not in scope for this context.
    UndefinedVariable(String),
    /// A sandbox limit was hit (operations, sizes, depth).
    Limit,
    /// Any other runtime error (type mismatch, missing function).
    Runtime,
    /// The value had the wrong type (e.g. a condition that is not boolean).
    Type,
}

/// Byte offset of a Rhai position (1-based line and character) in `text`.
pub fn offset_of_position(text: &str, pos: Position) -> Option<usize> {
    let line = pos.line()?;
    let col = pos.position().unwrap_or(1);
    let start = text.split_inclusive('\n').take(line - 1).map(str::len).sum::<usize>();
    let rest = &text[start.min(text.len())..];
    let line_text = rest.split('\n').next().unwrap_or("");
    Some(
        start
            + line_text
                .char_indices()
                .nth(col - 1)
                .map_or(line_text.len(), |(i, _)| i),
    )
}

fn parse_error(text: &str, e: &ParseError) -> ExprError {
    let kind = match e.err_type() {
        ParseErrorType::VariableUndefined(name) => ExprErrorKind::UndefinedVariable(name.clone()),
        ParseErrorType::ExprTooDeep | ParseErrorType::LiteralTooLarge(..) => ExprErrorKind::Limit,
        _ => ExprErrorKind::Syntax,
    };
    let message = match e.err_type() {
        // Rhai says "Script is incomplete"; here it is an expression.
        ParseErrorType::UnexpectedEOF => "incomplete: something is missing at its end".to_owned(),
        other => other.to_string(),
    };
    ExprError {
        message,
        offset: offset_of_position(text, e.position()),
        kind,
    }
}

/// Turn a Rhai runtime error into an [`ExprError`] positioned in `text`.
pub fn eval_error(text: &str, e: &EvalAltResult) -> ExprError {
    // A script is compiled when it is run: its compile errors come this way.
    if let EvalAltResult::ErrorParsing(kind, pos) = e {
        return parse_error(text, &ParseError(Box::new(kind.clone()), *pos));
    }
    let kind = match e {
        EvalAltResult::ErrorTooManyOperations(_)
        | EvalAltResult::ErrorTerminated(..)
        | EvalAltResult::ErrorTooManyVariables(_)
        | EvalAltResult::ErrorStackOverflow(_)
        | EvalAltResult::ErrorDataTooLarge(..)
        | EvalAltResult::ErrorTooManyModules(_) => ExprErrorKind::Limit,
        EvalAltResult::ErrorParsing(..) => ExprErrorKind::Syntax,
        EvalAltResult::ErrorMismatchOutputType(..) => ExprErrorKind::Type,
        _ => ExprErrorKind::Runtime,
    };
    let message = match e {
        EvalAltResult::ErrorTooManyOperations(_) => {
            "too many operations: the operation limit was reached (an endless loop?)".to_owned()
        }
        EvalAltResult::ErrorTerminated(..) => {
            "took too long: the evaluation ran past its wall-clock budget (an endless loop?)".to_owned()
        }
        EvalAltResult::ErrorDataTooLarge(what, _) => {
            // Rhai names the measure ("Length of string"); name the value.
            let what = match what.as_str() {
                "Length of string" => "string".to_owned(),
                "Size of array/BLOB" => "array".to_owned(),
                "Size of object map" => "object map".to_owned(),
                other => other.to_lowercase(),
            };
            format!("{what} too large: a value grew past its size limit")
        }
        EvalAltResult::ErrorStackOverflow(_) => "stack overflow: calls nest too deeply (endless recursion?)".to_owned(),
        other => {
            // Rhai appends " (line L, position P)"; the position is shown by
            // the diagnostic instead.
            let s = other.to_string();
            match s.rfind(" (line ") {
                Some(i) => s[..i].to_owned(),
                None => s,
            }
        }
    };
    ExprError {
        message,
        offset: offset_of_position(text, e.position()),
        kind,
    }
}

/// A compiled expression, ready to evaluate many times. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Compiled {
    source: Arc<str>,
    ast: Arc<AST>,
}

/// Compiles and evaluates expressions in one sandboxed engine, on the
/// threads of [`crate::pool`]. Cheap to clone.
#[derive(Clone)]
pub struct Evaluator {
    engine: Arc<Engine>,
    limits: Limits,
}

impl Default for Evaluator {
    fn default() -> Self {
        Evaluator::new(EXPR_LIMITS)
    }
}

impl std::fmt::Debug for Evaluator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evaluator")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A pool failure as an expression error.
fn pool_error(e: &crate::pool::PoolError) -> ExprError {
    ExprError {
        message: e.to_string(),
        offset: None,
        kind: ExprErrorKind::Limit,
    }
}

/// Whether `v` nests arrays and maps at most `max` deep. Recursion stops at
/// `max`, so it is bounded whatever `v` holds.
fn nests_within(v: &Dynamic, max: usize) -> bool {
    if let Some(a) = v.read_lock::<rhai::Array>() {
        return max > 0 && a.iter().all(|v| nests_within(v, max - 1));
    }
    if let Some(m) = v.read_lock::<rhai::Map>() {
        return max > 0 && m.values().all(|v| nests_within(v, max - 1));
    }
    true
}

impl Evaluator {
    /// An evaluator with the given limits.
    pub fn new(limits: Limits) -> Self {
        let mut engine = sandbox(limits);
        crate::truth::register(&mut engine);
        register_json(&mut engine, limits);
        Evaluator {
            engine: Arc::new(engine),
            limits,
        }
    }

    /// Compile `text` for `context`. Variables outside the context are
    /// rejected at compile time.
    pub fn compile(&self, text: &str, context: Context) -> Result<Compiled, ExprError> {
        let engine = Arc::clone(&self.engine);
        let source: Arc<str> = Arc::from(text);
        crate::pool::run(move || {
            let ast = engine
                .compile_with_scope(&context.scope(), &source)
                .map_err(|e| parse_error(&source, &e))?;
            Ok(Compiled {
                source,
                ast: Arc::new(ast),
            })
        })
        .map_err(|e| pool_error(&e))?
    }

    /// Compile an IR expression.
    pub fn compile_expr(&self, expr: &Expr, context: Context) -> Result<Compiled, ExprError> {
        self.compile(expr.source(), context)
    }

    /// Evaluate on a pool thread, within the wall-clock budget, and turn the
    /// value into `T` there (the value is dropped there too).
    fn on_pool<T: Send + 'static>(
        &self,
        compiled: &Compiled,
        vars: &Bindings,
        then: impl FnOnce(Dynamic) -> Result<T, ExprError> + Send + 'static,
    ) -> Result<T, ExprError> {
        let engine = Arc::clone(&self.engine);
        let compiled = compiled.clone();
        let vars = crate::value::scope_values(vars, None);
        let budget_ms = self.limits.budget_ms;
        crate::pool::run(move || {
            with_budget(budget_ms, || {
                let mut scope = Scope::new();
                for (k, v) in vars {
                    scope.push_constant_dynamic(k, v);
                }
                let value = engine
                    .eval_ast_with_scope::<Dynamic>(&mut scope, &compiled.ast)
                    .map_err(|e| eval_error(&compiled.source, &e))?;
                then(value)
            })
        })
        .map_err(|e| pool_error(&e))?
    }

    /// Evaluate to any value with the given variables bound. A value that
    /// nests arrays and maps deeper than [`MAX_RESULT_DEPTH`] is refused.
    pub fn eval(&self, compiled: &Compiled, vars: &Bindings) -> Result<Value, ExprError> {
        self.on_pool(compiled, vars, |v| {
            if nests_within(&v, MAX_RESULT_DEPTH) {
                Ok(crate::value::from_dynamic(v))
            } else {
                Err(ExprError {
                    message: format!(
                        "value too deep: the result nests arrays and maps more than {MAX_RESULT_DEPTH} levels deep"
                    ),
                    offset: None,
                    kind: ExprErrorKind::Limit,
                })
            }
        })
    }

    /// Evaluate and render the value as text (what a `{{ }}` interpolation
    /// puts into a prompt).
    pub fn eval_text(&self, compiled: &Compiled, vars: &Bindings) -> Result<String, ExprError> {
        self.on_pool(compiled, vars, |v| Ok(v.to_string()))
    }

    /// Evaluate a condition; anything but a boolean is a type error.
    pub fn eval_bool(&self, compiled: &Compiled, vars: &Bindings) -> Result<bool, ExprError> {
        self.on_pool(compiled, vars, |v| {
            v.as_bool().map_err(|ty| ExprError {
                message: format!("a condition must be true or false, this one gave {ty}"),
                offset: None,
                kind: ExprErrorKind::Type,
            })
        })
    }
    /// Evaluate a condition whose variables may hold absent metrics
    /// (see `truth`): `True` or `False` when the present values decide it,
    /// `Unknown` when an absent one does. Without absent metrics it is
    /// [`Evaluator::eval_bool`].
    ///
    /// Errors: as [`Evaluator::eval_bool`] when nothing is absent; with absent
    /// metrics, only the limits (time, operations): any other failure is `Unknown`.
    pub fn eval_truth(&self, compiled: &Compiled, vars: &Bindings) -> Result<Truth, ExprError> {
        if !vars.values().any(Value::holds_absent) {
            return self.eval_bool(compiled, vars).map(Truth::from);
        }
        let engine = Arc::clone(&self.engine);
        let compiled = compiled.clone();
        let vars = vars.clone();
        let budget_ms = self.limits.budget_ms;
        crate::pool::run(move || {
            with_budget(budget_ms, || {
                let mut pending: Vec<BTreeMap<String, bool>> = vec![BTreeMap::new()];
                let (mut seen_true, mut seen_false) = (false, false);
                let mut evaluations = 0;
                while let Some(chosen) = pending.pop() {
                    if evaluations == crate::truth::MAX_EVALUATIONS {
                        return Ok(Truth::Unknown);
                    }
                    evaluations += 1;
                    let atoms = Arc::new(std::sync::Mutex::new(crate::truth::Atoms {
                        chosen: chosen.clone(),
                        met: Vec::new(),
                    }));
                    let mut scope = Scope::new();
                    for (k, v) in crate::value::scope_values(&vars, Some(&atoms)) {
                        scope.push_constant_dynamic(k, v);
                    }
                    let value = match engine.eval_ast_with_scope::<Dynamic>(&mut scope, &compiled.ast) {
                        Ok(value) => value,
                        Err(e) => {
                            let e = eval_error(&compiled.source, &e);
                            if e.kind == ExprErrorKind::Limit {
                                return Err(e);
                            }
                            return Ok(Truth::Unknown);
                        }
                    };
                    match value.as_bool() {
                        Ok(true) => seen_true = true,
                        Ok(false) => seen_false = true,
                        Err(_) => return Ok(Truth::Unknown),
                    }
                    if seen_true && seen_false {
                        return Ok(Truth::Unknown);
                    }
                    // This evaluation took every atom it met without a choice as false;
                    // the first of them is chosen both ways next.
                    let first = atoms
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .met
                        .first()
                        .cloned();
                    if let Some(atom) = first {
                        let mut with_false = chosen.clone();
                        with_false.insert(atom.clone(), false);
                        let mut with_true = chosen;
                        with_true.insert(atom, true);
                        pending.push(with_false);
                        pending.push(with_true);
                    }
                }
                Ok(if seen_true { Truth::True } else { Truth::False })
            })
        })
        .map_err(|e| pool_error(&e))?
    }
}

/// `text.json`: the text parsed as JSON, as Rhai values (objects are maps,
/// arrays are arrays, `null` is `()`), so that `steps.plan.output.json.topics`
/// reads a field of a step's JSON answer. Text that is not JSON, or JSON past
/// the sandbox's sizes (items and entries in all, [`MAX_RESULT_DEPTH`] levels),
/// is an evaluation error that says so.
fn register_json(engine: &mut Engine, limits: Limits) {
    engine.register_get(
        "json",
        move |text: &mut rhai::ImmutableString| -> Result<Dynamic, Box<EvalAltResult>> {
            let value: serde_json::Value = serde_json::from_str(text.trim())
                .map_err(|e| format!("`.json`: the text is not JSON: {e}"))?;
            let mut budget = limits.max_array_size.max(limits.max_map_size);
            crate::value::json_to_dynamic(&value, MAX_RESULT_DEPTH, &mut budget).ok_or_else(|| {
                format!(
                    "`.json`: the JSON is too large: more than {} items and entries, or nested more than {MAX_RESULT_DEPTH} levels",
                    limits.max_array_size.max(limits.max_map_size)
                )
                .into()
            })
        },
    );
}

/// A dotted path (`steps.look.output`) referenced by an expression, with the
/// byte offset of its first segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRef {
    /// Segments, e.g. `["steps", "look", "output"]`.
    pub segments: Vec<String>,
    /// Byte offset of each segment in the expression text.
    pub offsets: Vec<usize>,
}

/// Dotted identifier paths in `text`, skipping string literals and comments,
/// so that references (`inputs.x`, `steps.y`, `gpu.util`) can be checked
/// against the workflow. An index by a string literal is a segment like a
/// dotted name (`steps["y"]`); an index by a whole number is a segment written
/// with its brackets (`[0]`), so that a JSON path (`json.topics[0].name`)
/// goes on through it.
pub fn paths(text: &str) -> Vec<PathRef> {
    let bytes = text.as_bytes();
    let mut out: Vec<PathRef> = Vec::new();
    let mut i = 0;
    // Whether the previous significant token was a `.` continuing a path,
    // and whether it followed something that is not a path start (a call,
    // an index, a literal).
    let mut current: Option<PathRef> = None;
    let mut after_dot = false;
    let mut prev_blocks_path = false;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'"' | b'`' | b'\'' => {
                let quote = c;
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                out.extend(current.take());
                after_dot = false;
                prev_blocks_path = true;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'.' => {
                after_dot = true;
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let word = &text[start..i];
                if after_dot {
                    if let Some(p) = current.as_mut() {
                        p.segments.push(word.to_owned());
                        p.offsets.push(start);
                    }
                } else {
                    out.extend(current.take());
                    if !prev_blocks_path {
                        current = Some(PathRef {
                            segments: vec![word.to_owned()],
                            offsets: vec![start],
                        });
                    }
                }
                after_dot = false;
                prev_blocks_path = false;
            }
            c if c.is_ascii_whitespace() => i += 1,
            // `steps["look"]` is the same path as `steps.look`.
            b'[' if current.is_some() && !after_dot => {
                let mut j = i + 1;
                while j < bytes.len() && bytes[j].is_ascii_whitespace() {
                    j += 1;
                }
                let quoted = bytes.get(j).copied().filter(|q| *q == b'"' || *q == b'`');
                let key = quoted.and_then(|q| {
                    let start = j + 1;
                    let len = text.get(start..)?.find(q as char)?;
                    let mut k = start + len + 1;
                    while k < bytes.len() && bytes[k].is_ascii_whitespace() {
                        k += 1;
                    }
                    let key = &text[start..start + len];
                    (bytes.get(k) == Some(&b']') && !key.contains(['\\', '$'])).then_some((start, key, k + 1))
                });
                // `json.topics[0]`: an index by a whole number is a segment `[0]`.
                let digits = bytes[i + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
                let index = (digits > 0 && bytes.get(i + 1 + digits) == Some(&b']'))
                    .then(|| (i, &text[i..i + digits + 2], i + digits + 2));
                match (key.or(index), current.as_mut()) {
                    (Some((start, key, next)), Some(p)) => {
                        p.segments.push(key.to_owned());
                        p.offsets.push(start);
                        i = next;
                    }
                    _ => {
                        // An index by expression: what it reaches is not
                        // known before run time.
                        out.extend(current.take());
                        prev_blocks_path = false;
                        i += 1;
                    }
                }
            }
            b')' | b']' | b'0'..=b'9' => {
                out.extend(current.take());
                after_dot = false;
                // `foo().bar` and `x[0].y` are not variable paths.
                prev_blocks_path = true;
                i += 1;
                while c.is_ascii_digit() && i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
            }
            _ => {
                out.extend(current.take());
                after_dot = false;
                prev_blocks_path = false;
                i += 1;
            }
        }
    }
    out.extend(current);
    // A path ending in a call (`steps.look.output.len()`) keeps the segments
    // before the method; the caller checks only the first ones.
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_skip_strings_and_calls() {
        let p = paths(r#"steps.review.output.contains("LGTM") && inputs.x > 0 && "a.b".len() > 0"#);
        let segs: Vec<Vec<String>> = p.into_iter().map(|p| p.segments).collect();
        assert_eq!(
            segs,
            vec![
                vec!["steps".to_owned(), "review".into(), "output".into(), "contains".into()],
                vec!["inputs".to_owned(), "x".into()],
            ]
        );
    }

    #[test]
    fn index_by_string_is_a_path_segment() {
        let p = paths(r#"steps["look"].output + inputs[ "x" ] + steps[n]"#);
        let segs: Vec<Vec<String>> = p.into_iter().map(|p| p.segments).collect();
        assert_eq!(
            segs,
            vec![
                vec!["steps".to_owned(), "look".into(), "output".into()],
                vec!["inputs".to_owned(), "x".into()],
                vec!["steps".to_owned()],
                // The index expression's own variables are paths too.
                vec!["n".to_owned()],
            ]
        );
    }

    #[test]
    fn index_by_number_is_a_bracketed_segment() {
        let p = paths("steps.plan.output.json.topics[0].name + x[ 1 ].y + z[i]");
        let segs: Vec<Vec<String>> = p.iter().map(|p| p.segments.clone()).collect();
        let strs = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            segs,
            vec![
                strs(&["steps", "plan", "output", "json", "topics", "[0]", "name"]),
                strs(&["x"]),
                strs(&["z"]),
                strs(&["i"]),
            ]
        );
        assert_eq!(p[0].offsets[5], "steps.plan.output.json.topics".len());
    }

    #[test]
    fn conditions_evaluate_with_bound_variables() {
        let ev = Evaluator::default();
        let c = ev.compile("gpu.util > 0.8", Context::Reflex).expect("compiles");
        let vars = Bindings::from([("gpu".to_owned(), Value::map([("util", Value::Float(0.9))]))]);
        assert_eq!(ev.eval_bool(&c, &vars), Ok(true));
    }

    #[test]
    fn undefined_variables_fail_at_compile_time() {
        let ev = Evaluator::default();
        let e = ev.compile("gpu.util > limit", Context::Reflex).expect_err("undefined");
        assert_eq!(e.kind, ExprErrorKind::UndefinedVariable("limit".into()));
        assert_eq!(e.offset, Some(11));
    }
}
