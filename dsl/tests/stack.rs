//! No Rhai input can overflow a stack: everything that makes Rhai recurse is
//! bounded by a sandbox limit, and each bound, reached, fits in a quarter of
//! the evaluation pool's stack (`skein_dsl::pool::STACK_BYTES`).
//!
//! The deep-value tests build the deepest value the size limits allow
//! directly (a script cannot build it quickly: each level's size check walks
//! the levels below, so the wall-clock budget stops it far earlier) and make
//! Rhai clone, compare, print, size-check and drop it.

use std::collections::BTreeMap;

use rhai::{Array, Dynamic, Map, Scope};
use skein_dsl::expr::{self, Context, EXPR_LIMITS, Evaluator, ExprErrorKind, Limits, SCRIPT_LIMITS};
use skein_dsl::pool::STACK_BYTES;

/// Run `f` on a thread with a quarter of the pool's stack.
fn on_quarter_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(STACK_BYTES / 4)
        .spawn(f)
        .expect("thread")
        .join()
        .expect("no overflow, no panic")
}

/// Arrays within arrays `arrays` deep, inside maps within maps `maps` deep.
fn deep_value(arrays: usize, maps: usize) -> Dynamic {
    let mut v = Dynamic::from_array(Array::new());
    for _ in 1..arrays {
        v = Dynamic::from_array(vec![v]);
    }
    for _ in 0..maps {
        let mut m = Map::new();
        m.insert("a".into(), v);
        v = Dynamic::from_map(m);
    }
    v
}

/// Clone, compare, print, size-check and drop the deepest value `limits`
/// allow; every step ends with a value or a Rhai error.
fn exercise_deepest_value(limits: Limits) {
    on_quarter_stack(move || {
        // Each nested item counts against the size limits, so one short of
        // each limit is the deepest value the sandbox lets a script hold.
        let value = deep_value(limits.max_array_size - 1, limits.max_map_size - 1);
        let engine = expr::sandbox(limits);
        let mut scope = Scope::new();
        scope.push_dynamic("v", value);
        for script in [
            "let w = v; w.len()",
            "let w = v; w == v",
            "v.to_string().len()",
            "v.to_debug().len()",
            "let w = [v]; w.len()",
            "let w = v; w.a = 1; w.len()",
        ] {
            // Any outcome but a crash: a size limit may refuse the copy.
            let _ = engine.eval_with_scope::<Dynamic>(&mut scope, script);
        }
        drop(scope);
    });
}

#[test]
fn the_deepest_value_of_an_expression_fits() {
    exercise_deepest_value(EXPR_LIMITS);
}

#[test]
fn the_deepest_value_of_a_script_fits() {
    exercise_deepest_value(SCRIPT_LIMITS);
}

/// The deepest `(((inner)))` that `limits` let compile as a function body
/// (`in_fn`) or a whole expression.
fn deepest_parens(limits: Limits, inner: &str, in_fn: bool) -> usize {
    let engine = expr::sandbox(limits);
    let text = |d: usize| {
        let e = format!("{}{inner}{}", "(".repeat(d), ")".repeat(d));
        if in_fn {
            format!("fn f(n) {{ {e} }}")
        } else {
            format!("let n = 1; {e}")
        }
    };
    let mut depth = 1;
    while engine.compile(text(depth + 1)).is_ok() {
        depth += 1;
    }
    assert!(engine.compile(text(depth + 1)).is_err());
    depth
}

#[test]
fn the_deepest_calls_fit() {
    for limits in [EXPR_LIMITS, SCRIPT_LIMITS] {
        // Every call level nests its body's expression as deep as allowed.
        let depth = on_quarter_stack(move || deepest_parens(limits, "f(n + 1)", true));
        let body = format!("{}f(n + 1){}", "(".repeat(depth), ")".repeat(depth));
        let script = format!("fn f(n) {{ {body} }} f(0)");
        let e = on_quarter_stack(move || {
            let engine = expr::sandbox(limits);
            engine
                .eval::<Dynamic>(&script)
                .map(|_| ())
                .map_err(|e| expr::eval_error(&script, &e))
        })
        .expect_err("endless recursion");
        assert_eq!(e.kind, ExprErrorKind::Limit, "{e:?}");
        assert!(e.message.contains("stack overflow"), "{e}");
    }
}

#[test]
fn the_deepest_expression_fits_and_a_deeper_one_is_refused() {
    for limits in [EXPR_LIMITS, SCRIPT_LIMITS] {
        let (fits, refused) = on_quarter_stack(move || {
            let depth = deepest_parens(limits, "n", false);
            let engine = expr::sandbox(limits);
            let nested = |d: usize| format!("let n = 1; {}n{}", "(".repeat(d), ")".repeat(d));
            let fits = engine.eval::<i64>(&nested(depth)).map_err(|e| e.to_string());
            let refused = engine.compile(nested(100_000)).map(|_| ()).map_err(|e| e.to_string());
            (fits, refused)
        });
        assert_eq!(fits, Ok(1));
        assert!(refused.expect_err("too deep").contains("maximum complexity"));
    }
}

#[test]
fn closures_cannot_capture_so_function_pointers_cannot_chain() {
    let ev = Evaluator::default();
    let e = ev
        .compile("let f = || 1; loop { let g = f; f = || g.call() + 1; }", Context::Step)
        .expect_err("a capturing closure");
    assert_eq!(e.kind, ExprErrorKind::UndefinedVariable("g".into()), "{e:?}");
    let e = ev
        .compile(
            "let f = |x| 1; loop { f = (|h, x| h.call(x) + 1).curry(f); }",
            Context::Step,
        )
        .expect_err("curry");
    assert_eq!(e.kind, ExprErrorKind::Syntax, "{e:?}");
    let e = ev
        .compile("curry(Fn(\"len\"), \"x\")", Context::Step)
        .expect_err("curry");
    assert!(e.message.contains("curry"), "{e}");
    // Without capture, anonymous functions still work.
    let c = ev
        .compile("[1, 2, 3].map(|x| x * 2).len() == 3", Context::Step)
        .expect("compiles");
    assert_eq!(ev.eval_bool(&c, &BTreeMap::new()), Ok(true));
}

#[test]
fn a_deep_result_is_refused_on_the_pool() {
    let ev = Evaluator::new(SCRIPT_LIMITS);
    let c = ev
        .compile("let a = []; for i in 0..1000 { a = [a]; } a", Context::Step)
        .expect("compiles");
    let e = ev.eval(&c, &BTreeMap::new()).expect_err("too deep");
    assert_eq!(e.kind, ExprErrorKind::Limit, "{e:?}");
    assert!(e.message.contains("too deep"), "{e}");
    // As text, the same value is fine.
    let text = ev.eval_text(&c, &BTreeMap::new()).expect("renders");
    assert!(text.starts_with("[[[["), "{text}");
}

#[test]
fn a_slow_evaluation_is_stopped_by_its_wall_clock_budget() {
    // So many operations that only the clock can stop the loop.
    let limits = Limits {
        max_operations: u64::MAX,
        budget_ms: 50,
        ..EXPR_LIMITS
    };
    let ev = Evaluator::new(limits);
    let c = ev.compile("loop { }", Context::Step).expect("compiles");
    let e = ev.eval(&c, &BTreeMap::new()).expect_err("stopped");
    assert_eq!(e.kind, ExprErrorKind::Limit, "{e:?}");
    assert!(e.message.contains("took too long"), "{e}");
}

/// One layer of a generated program: each wraps the expression inside it.
#[derive(Debug, Clone, Copy)]
enum Layer {
    /// `(|| inner)`: an anonymous function (called by the next `Call`).
    Closure,
    /// `inner.call()`.
    Call,
    /// `(inner)`.
    Paren,
    /// `[inner]`.
    Array,
    /// `#{ a: inner }`.
    Map,
    /// `Fn("len").curry(inner)`: refused.
    Curry,
    /// `{ let v = inner; || v }`: a capturing closure, refused.
    Capture,
}

fn layer() -> impl proptest::strategy::Strategy<Value = Layer> {
    proptest::prop_oneof![
        proptest::strategy::Just(Layer::Closure),
        proptest::strategy::Just(Layer::Call),
        proptest::strategy::Just(Layer::Paren),
        proptest::strategy::Just(Layer::Array),
        proptest::strategy::Just(Layer::Map),
        proptest::strategy::Just(Layer::Curry),
        proptest::strategy::Just(Layer::Capture),
    ]
}

/// The program of `layers` around `1`, inside `loop` when `looped` (so that
/// chains grow until a limit stops them).
fn program(layers: &[Layer], looped: bool) -> String {
    let mut e = "x".to_owned();
    for l in layers {
        e = match l {
            Layer::Closure => format!("(|| {e})"),
            Layer::Call => format!("({e}).call()"),
            Layer::Paren => format!("({e})"),
            Layer::Array => format!("[{e}]"),
            Layer::Map => format!("#{{ a: {e} }}"),
            Layer::Curry => format!("Fn(\"len\").curry({e})"),
            Layer::Capture => format!("{{ let v = {e}; || v }}"),
        };
    }
    if looped {
        format!("let x = 1; loop {{ x = {e}; }}")
    } else {
        format!("let x = 1; {e}")
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Nested closures, calls, arrays, maps and curries, as an expression and
    /// as a workflow script, end with a value or an error: never an abort.
    #[test]
    fn generated_nesting_never_aborts(layers in proptest::collection::vec(layer(), 0..400), looped: bool) {
        let text = program(&layers, looped);
        let ev = Evaluator::default();
        if let Ok(c) = ev.compile(&text, Context::Step) {
            let _ = ev.eval(&c, &BTreeMap::new());
            let _ = ev.eval_text(&c, &BTreeMap::new());
        }
        let parsed = skein_dsl::parse("p.rhai", &format!("workflow(\"p\");\n{text};\n"));
        proptest::prop_assert!(!parsed.is_valid() || parsed.workflow.is_some());
    }
}

#[test]
fn curry_is_refused_with_a_hint_in_conditions_and_scripts() {
    let yaml = "name: c\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct }\nsteps:\n  - { id: s, agent: a, prompt: hi, when: 'Fn(\"len\").curry(\"x\").call() > 0' }\n";
    let script = "workflow(\"c\");\nlet f = |x| 1;\nloop { f = (|h, x| h.call(x) + 1).curry(f); }\n";
    for (name, text) in [("c.yaml", yaml), ("c.rhai", script)] {
        let parsed = skein_dsl::parse(name, text);
        assert!(!parsed.is_valid());
        let d = parsed.diagnostics.iter().next().expect("a diagnostic");
        let help = d.help.as_deref().unwrap_or("");
        assert!(help.contains("`curry` is not available"), "{name}: {d:?}");
    }
}
