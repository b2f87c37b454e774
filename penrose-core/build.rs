//! Compiles the AVX-512 IFMA Montgomery kernel (`csrc/mont_ifma.c`) on x86-64 and sets
//! `cfg(penrose_ifma)`, under which `paillier::montgomery` links it. On other targets, or when
//! the C compiler cannot build it, the cfg stays unset and the crate multiplies on GMP alone.
//!
//! The file is compiled without any -m flag: only its kernel functions carry
//! `target("avx512f,avx512ifma")`, and the Rust side calls them only after detecting both
//! features at run time, so the crate still runs on any x86-64.

fn main() {
    let source = "csrc/mont_ifma.c";
    println!("cargo::rerun-if-changed={source}");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(penrose_ifma)");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        return;
    }
    let built = cc::Build::new()
        .file(source)
        .opt_level(2)
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .try_compile("penrose_mont_ifma");
    match built {
        Ok(()) => println!("cargo::rustc-cfg=penrose_ifma"),
        Err(e) => println!(
            "cargo::warning=the AVX-512 IFMA Montgomery kernel did not compile ({e}); \
             Montgomery multiplication uses GMP only"
        ),
    }
}
