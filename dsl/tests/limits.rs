//! Rhai is untrusted input: endless loops and huge allocations end with a
//! limit error, in expressions and in whole workflow scripts.
//!
//! The stop is decided by operation and size counters, not by a clock, so
//! these tests assert the error kind; how long the stop takes is measured in
//! `benches/dsl.rs` (docs/PERFORMANCE.md).

use std::collections::BTreeMap;

use skein_dsl::Code;
use skein_dsl::expr::{Context, Evaluator, ExprErrorKind};

fn eval_err(src: &str) -> skein_dsl::expr::ExprError {
    let ev = Evaluator::default();
    let compiled = ev.compile(src, Context::Step).expect("compiles");
    ev.eval(&compiled, &BTreeMap::new()).expect_err("must hit a limit")
}

#[test]
fn endless_loop_in_an_expression_hits_the_operation_limit() {
    let e = eval_err("loop { }");
    assert_eq!(e.kind, ExprErrorKind::Limit, "{e:?}");
    assert!(e.message.contains("too many operations"), "{e}");
    let e = eval_err("let n = 0; while true { n += 1; } n > 0");
    assert_eq!(e.kind, ExprErrorKind::Limit, "{e:?}");
}

#[test]
fn huge_string_in_an_expression_hits_the_size_limit() {
    let e = eval_err(r#"let s = "x"; loop { s += s; }"#);
    assert_eq!(e.kind, ExprErrorKind::Limit, "{e:?}");
    assert!(e.message.contains("too large"), "{e}");
    let e = eval_err(r#""".pad(1_000_000_000, "x").len() > 0"#);
    assert_eq!(e.kind, ExprErrorKind::Limit, "{e:?}");
}

#[test]
fn endless_recursion_hits_the_call_depth_limit() {
    let e = eval_err("fn f(n) { f(n + 1) } f(0)");
    assert_eq!(e.kind, ExprErrorKind::Limit, "{e:?}");
}

#[test]
fn huge_array_hits_the_size_limit() {
    let e = eval_err("let a = []; loop { a.push(1); }");
    assert_eq!(e.kind, ExprErrorKind::Limit, "{e:?}");
}

#[test]
fn eval_and_imports_are_not_available() {
    let ev = Evaluator::default();
    assert!(ev.compile(r#"eval("1")"#, Context::Step).is_err());
    assert!(ev.compile(r#"import "x" as y; 1"#, Context::Step).is_err());
}

#[test]
fn workflow_scripts_are_stopped_too() {
    for (src, what) in [
        ("workflow(\"w\");\nloop { }\n", "too many operations"),
        ("let s = \"ab\";\nwhile true { s += s; }\n", "too large"),
    ] {
        let parsed = skein_dsl::parse("w.rhai", src);
        assert!(!parsed.is_valid());
        let d = parsed.diagnostics.iter().next().expect("a diagnostic");
        assert_eq!(d.code, Code::ScriptLimit, "{d:?}");
        assert!(d.message.contains(what), "{}", d.message);
        // Positioned on line 2, where the loop runs.
        assert_eq!(parsed.file.line_col(d.span.start).line, 2, "{d:?}");
    }
}
