// A binary's main body run so that an exception escaping it (an allocation that cannot be met,
// a library's check) ends the program with a named error on stderr and exit status 1, never
// with std::terminate's abort and core dump:
//
//   int main(int argc, char** argv) {
//     return plait::base::RunCatchingExceptions("plan_check", [&] { return Check(argc, argv); });
//   }
#ifndef PLAIT_BASE_GUARDED_MAIN_H_
#define PLAIT_BASE_GUARDED_MAIN_H_

#include <exception>
#include <iostream>
#include <new>

#include "absl/strings/string_view.h"

namespace plait::base {

template <typename Body>
int RunCatchingExceptions(absl::string_view program, const Body& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    std::cerr << program << ": stopped: out of memory\n";
  } catch (const std::exception& error) {
    std::cerr << program << ": stopped by an unexpected error: " << error.what() << "\n";
  }
  return 1;
}

}  // namespace plait::base

#endif  // PLAIT_BASE_GUARDED_MAIN_H_
