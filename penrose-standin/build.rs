//! Compiles the stand-in libcuda (`csrc/standin.c`) into `$OUT_DIR/libcuda.so.1` and tells the
//! crate where it is (`PENROSE_STANDIN_LIBCUDA`), so tests and the replayer can install it.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "csrc/standin.c";
    println!("cargo:rerun-if-changed={source}");
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        panic!("cargo sets OUT_DIR for build scripts");
    };
    let output = out_dir.join("libcuda.so.1");

    // The cc crate picks the compiler and target flags cargo would; we only need a shared
    // object, which cc::Build does not produce itself.
    let compiler = cc::Build::new()
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args([
        "-std=c11",
        "-shared",
        "-fPIC",
        "-pthread",
        "-fvisibility=hidden",
        "-Wl,-soname,libcuda.so.1",
        "-o",
    ])
    .arg(&output)
    .arg(source);
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler ({cmd:?}): {e}"));
    assert!(status.success(), "compiling {source} failed: {cmd:?}");
    println!(
        "cargo:rustc-env=PENROSE_STANDIN_LIBCUDA={}",
        output.display()
    );
}
