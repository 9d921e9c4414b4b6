//! The `ferry` command-line tool.
fn main() {
    println!("ferry");
}
