// What the store's table descriptions (store_tables.h) bind a row to and read it
// from, whatever the database: a statement's parameters (1-based) and a result's
// current row (0-based columns). SQLite's statement (sqlite.h) and PostgreSQL's
// (postgres.h) implement both. Internal to the store.
#ifndef DDP_COORDINATOR_STORE_SQL_ROW_H_
#define DDP_COORDINATOR_STORE_SQL_ROW_H_

#include <cstdint>
#include <string>
#include <type_traits>

namespace ddp::sql {

class Params {
 public:
  virtual ~Params() = default;
  virtual void BindText(int i, const std::string& v) = 0;
  virtual void BindInt(int i, int64_t v) = 0;
  virtual void BindReal(int i, double v) = 0;  // NaN is stored as NULL.

  // A value of any field type: strings as text, floating point as real, booleans,
  // enums and integers as integers.
  template <typename T>
  void BindValue(int i, const T& v) {
    if constexpr (std::is_same_v<T, std::string>) {
      BindText(i, v);
    } else if constexpr (std::is_floating_point_v<T>) {
      BindReal(i, static_cast<double>(v));
    } else {
      BindInt(i, static_cast<int64_t>(v));
    }
  }
};

class Row {
 public:
  virtual ~Row() = default;
  virtual int64_t Int(int col) const = 0;
  virtual double Real(int col) const = 0;  // NULL reads as NaN.
  virtual std::string Text(int col) const = 0;

  template <typename T>
  T Value(int col) const {
    if constexpr (std::is_same_v<T, std::string>) {
      return Text(col);
    } else if constexpr (std::is_floating_point_v<T>) {
      return static_cast<T>(Real(col));
    } else if constexpr (std::is_same_v<T, bool>) {
      return Int(col) != 0;
    } else {
      return static_cast<T>(Int(col));
    }
  }
};

}  // namespace ddp::sql

#endif  // DDP_COORDINATOR_STORE_SQL_ROW_H_
