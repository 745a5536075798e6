#include <iostream>
int main() { std::cout << "yolo8\n"; return 0; }
