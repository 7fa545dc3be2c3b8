//! Generated nesting, the shapes that make Rhai recurse: each input byte picks a layer
//! (anonymous function, call, parentheses, array, map, curry, capturing closure,
//! recursive function) wrapped around the one before; the program runs as a condition
//! and as a workflow script, once straight and once in a `loop` that grows it until a
//! limit stops it. Any outcome is fine but an abort or a panic (a stack overflow aborts
//! the fuzzer, which reports it as a crash).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use skein_dsl::expr::{Context, Evaluator};

fn program(data: &[u8]) -> String {
    let mut e = "x".to_owned();
    for b in data.iter().skip(1) {
        e = match b % 8 {
            0 => format!("(|| {e})"),
            1 => format!("({e}).call()"),
            2 => format!("({e})"),
            3 => format!("[{e}]"),
            4 => format!("#{{ a: {e} }}"),
            5 => format!("Fn(\"len\").curry({e})"),
            6 => format!("{{ let v = {e}; || v }}"),
            _ => format!("{{ fn r(n) {{ if n > 0 {{ r(n - 1) }} else {{ {e} }} }} r({b}) }}"),
        };
    }
    match data.first().map(|b| b % 2) {
        Some(1) => format!("let x = 1; loop {{ x = {e}; }}"),
        _ => format!("let x = 1; {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let text = program(&data[..data.len().min(2_000)]);
    let ev = Evaluator::default();
    if let Ok(c) = ev.compile(&text, Context::Step) {
        let _ = ev.eval_bool(&c, &BTreeMap::new());
        let _ = ev.eval_text(&c, &BTreeMap::new());
    }
    let _ = skein_dsl::parse("depth.rhai", &format!("workflow(\"d\");\n{text};\n"));
});
