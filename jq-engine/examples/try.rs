fn main() {
    let args: Vec<String> = std::env::args().collect();
    let p = plumber_jq::compile(&args[1], plumber_jq::Val::Null).unwrap();
    let input = plumber_jq::json_in::read(args[2].as_bytes()).unwrap();
    for o in p.run(input) {
        match o {
            Ok(v) => println!("{v}  {v:?}"),
            Err(e) => println!("ERR {e:?}"),
        }
    }
}
