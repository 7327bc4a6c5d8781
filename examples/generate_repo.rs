//! `cargo run --release --example generate_repo -- DIR TOPOLOGIES [CHANGED]`: writes a
//! benchmark repository (20 steps per topology, two commits) and prints the two commit ids.

#[path = "../benches/support/repo_gen.rs"]
mod repo_gen;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: generate_repo DIR TOPOLOGIES [CHANGED]";
    let dir = args.next().ok_or(usage)?;
    let topologies: usize = args.next().ok_or(usage)?.parse()?;
    let changed: usize = args.next().map(|c| c.parse()).transpose()?.unwrap_or(10);
    let (first, second) = repo_gen::generate(std::path::Path::new(&dir), topologies, changed)?;
    println!("{first} {second}");
    Ok(())
}
