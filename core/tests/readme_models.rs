//! The README's model table names exactly the architectures the engine runs:
//! adding one to `Arch` without a row (or a row without the code) fails here.

use pocket_core::gguf::Arch;

#[test]
fn the_readme_model_table_lists_every_architecture() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md");
    let table = readme.split("<!-- models:").nth(1).expect("the README's model table marker");
    let rows: Vec<&str> = table.lines().skip(1).take_while(|l| l.starts_with('|')).skip(2).collect();
    assert!(!rows.is_empty(), "the model table has no rows");
    let mut listed: Vec<String> = rows
        .iter()
        .map(|row| {
            let cell = row.split('|').nth(2).expect("an architecture column").trim();
            cell.trim_matches('`').to_string()
        })
        .collect();
    listed.sort();
    let mut engine: Vec<String> = Arch::all().map(|a| a.name().to_string()).collect();
    engine.sort();
    assert_eq!(
        listed, engine,
        "README.md's model table (second column) must list exactly the architectures in core/src/gguf/keys.rs"
    );
}
