// Renders a `systemone` template with llama.cpp's own Jinja engine (common/jinja), the way its
// server renders a decision model's prompt: the template parsed with the chat-template lexer
// defaults, the request's values given as globals, the output's string parts joined.
//
//   native_render TEMPLATE_FILE < inputs.jsonl > rendered.jsonl
//
// Each input line is a JSON object of the template's values; each output line is a JSON object,
// {"text": "..."} or {"error": "..."}. Built by bench/native_template.py against the llama.cpp
// source of the release onepass uses.

#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"
#include "json.h"

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::cerr << "usage: native_render TEMPLATE_FILE < inputs.jsonl\n";
        return 2;
    }
    std::ifstream file(argv[1], std::ios::binary);
    std::stringstream source;
    source << file.rdbuf();

    jinja::lexer lexer;
    const auto tokens = lexer.tokenize(source.str());
    const jinja::program prog = jinja::parse_from_tokens(tokens);

    std::string line;
    while (std::getline(std::cin, line)) {
        common_json out = common_json::object();
        try {
            const common_json inputs = common_json::parse(line);
            jinja::context ctx(tokens.source);
            jinja::global_from_json(ctx, inputs, false);
            jinja::runtime runtime(ctx);
            const jinja::value results = runtime.execute(prog);
            out["text"] = jinja::runtime::gather_string_parts(results)->as_string().str();
        } catch (const std::exception & error) {
            out["error"] = std::string(error.what());
        }
        std::cout << out.dump() << "\n" << std::flush;
    }
    return 0;
}
