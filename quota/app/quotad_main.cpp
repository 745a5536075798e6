#include <iostream>

int main() {
  std::cerr << "quotad: not built yet (see the quota issue)\n";
  return 2;
}
